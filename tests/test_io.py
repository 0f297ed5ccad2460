"""aiayn.io: the marked-section rewrite that keeps generated tables inside hand-written docs."""

from aiayn.io import write_section

B, E = "<!-- t:begin -->", "<!-- t:end -->"


def test_write_section_replaces_only_between_markers(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"# Title\n\nintro\n\n{B}\nold table\n{E}\n\noutro\n")
    write_section(doc, B, E, "| new | table |\n")
    assert doc.read_text() == f"# Title\n\nintro\n\n{B}\n| new | table |\n{E}\n\noutro\n"
    write_section(doc, B, E, "again")  # idempotent layout: markers kept, one block
    assert doc.read_text().count(B) == 1 and "again" in doc.read_text() and "new" not in doc.read_text()


def test_write_section_appends_or_creates(tmp_path):
    doc = tmp_path / "doc.md"
    write_section(doc, B, E, "table", new_file="# Head\n")
    assert doc.read_text() == f"# Head\n\n{B}\ntable\n{E}\n"
    other = tmp_path / "other.md"
    other.write_text("text without markers\n")
    write_section(other, B, E, "t2")
    assert other.read_text() == f"text without markers\n\n{B}\nt2\n{E}\n"
