"""Running a model: one :class:`~aiayn.runtime.backend.Backend` protocol, three runtimes.

PyTorch (:mod:`aiayn.runtime.torch_backend`) runs a model folder, ONNX Runtime
(:mod:`aiayn.runtime.onnx_backend`) and CTranslate2 (:mod:`aiayn.runtime.ct2_backend`) a folder
``aiayn export`` wrote. Each backend declares its capabilities; what a kind needs
(:mod:`aiayn.kinds`) or a caller asks for and the backend lacks is one line naming the backend.
Which backend runs a folder is chosen where the folder is opened (:mod:`aiayn.folder.open`); the
runtimes know nothing of folders' files. Which backend to use when: docs/runtime.md.
"""

from aiayn.runtime.backend import CAPABILITIES, ENGINES, Backend, Unsupported, refuse, require

__all__ = ["CAPABILITIES", "ENGINES", "Backend", "Unsupported", "refuse", "require"]
