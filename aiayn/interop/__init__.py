"""Models from other toolkits: ``aiayn import hf`` reads a Hugging Face Marian (OPUS-MT) folder
(:mod:`aiayn.interop.marian`). Writing aiayn's models for transformers is
:mod:`aiayn.export.hf`."""
