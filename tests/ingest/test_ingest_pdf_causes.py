"""Three PDF warnings that named the wrong cause, each with a fixture built here: a page expensive to draw (thousands
of small images drawn through form XObjects) is named as such, not as damaged structure; a truncated PDF whose
text survives but whose fonts were in the lost part says so; an empty printed page label falls back to the page's
physical number."""

import io

import pytest
from pypdf import PdfReader, PdfWriter
from pypdf.generic import ArrayObject, DecodedStreamObject, DictionaryObject, NameObject, NumberObject

from locks_chat.errors import NoTextError
from locks_chat.ingest import load_document
from locks_chat.ingest.pdf import FONTS_LOST
from locks_tools.fuzz_pdf import FONT, assemble, show, stream
from tests.support.ingest_samples import raw_text_pdf, show_text, text_pdf, write

FORM_LIMIT = 5_000
"""pypdf's ``xform_maximum_invocations_per_extraction`` (pypdf 7)"""


def _xobject(data: bytes, entries: dict) -> DecodedStreamObject:
    obj = DecodedStreamObject()
    obj.set_data(data)
    obj.update({NameObject(k): v for k, v in entries.items()})
    return obj


def many_small_images_pdf(images: int) -> bytes:
    """Three pages; the second draws ``images`` 2x2 images, each through a form XObject (as a page of icons or a
    tiled scan is drawn), after its text."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(raw_text_pdf(
        [show_text("First page."), show_text("The second page is a mosaic."), show_text("Third page.")]))))
    image = writer._add_object(_xobject(b"\x00\xff\x00\xff", {
        "/Type": NameObject("/XObject"), "/Subtype": NameObject("/Image"), "/Width": NumberObject(2),
        "/Height": NumberObject(2), "/ColorSpace": NameObject("/DeviceGray"), "/BitsPerComponent": NumberObject(8)}))
    form = writer._add_object(_xobject(b"q 2 0 0 2 0 0 cm /Im0 Do Q", {
        "/Type": NameObject("/XObject"), "/Subtype": NameObject("/Form"),
        "/BBox": ArrayObject([NumberObject(0), NumberObject(0), NumberObject(2), NumberObject(2)]),
        "/Resources": DictionaryObject({NameObject("/XObject"): DictionaryObject({NameObject("/Im0"): image})})}))
    page = writer.pages[1]
    page[NameObject("/Resources")][NameObject("/XObject")] = DictionaryObject({NameObject("/Fm0"): form})
    tiles = b"".join(b"q 1 0 0 1 %d %d cm /Fm0 Do Q " % (i % 300, i // 300) for i in range(images))
    page.replace_contents(_xobject(page.get_contents().get_data() + b" " + tiles, {}))
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_a_page_expensive_to_draw_is_named_with_its_cause(tmp_path):
    document = load_document(write(tmp_path, "mosaic.pdf", many_small_images_pdf(FORM_LIMIT + 1)))
    assert document.warnings == (f"page 2: expensive to draw (more than {FORM_LIMIT:,} form XObjects, such as many "
                                 "small images), read up to that many; text drawn after them is missing",)
    assert not any("damaged" in w for w in document.warnings)
    assert "The second page is a mosaic." in document.pages[1].text


def test_a_page_under_the_limit_has_no_warning(tmp_path):
    assert load_document(write(tmp_path, "mosaic.pdf", many_small_images_pdf(50))).warnings == ()


def fonts_at_the_end(pages: list[bytes]) -> tuple[bytes, bytes]:
    """A PDF whose pages share one ``/Resources`` object written last, after every content stream, and that PDF
    cut just before it: what a download cut short keeps of a file whose writer put the fonts at the end."""
    count = len(pages)
    kids = b" ".join(b"%d 0 R" % (3 + 2 * i) for i in range(count))
    resources = 3 + 2 * count
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count)]
    for i, text in enumerate(pages):
        objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %d 0 R /Contents %d 0 R >>"
                    % (resources, 4 + 2 * i), stream(show(text))]
    objects += [b"<< /Font << /F1 %d 0 R >> >>" % (resources + 1), FONT]
    data = assemble(objects)
    return data, data[: data.index(b"%d 0 obj" % resources)]


def test_a_truncated_pdf_that_lost_its_fonts_says_so(tmp_path):
    whole, cut = fonts_at_the_end([b"The keeper is Ann Marsh.", b"The lamp burns all night."])
    assert "Ann Marsh" in load_document(write(tmp_path, "whole.pdf", whole)).text
    with pytest.raises(NoTextError) as refused:
        load_document(write(tmp_path, "cut.pdf", cut))
    message = str(refused.value)
    assert message == f"{tmp_path / 'cut.pdf'}: truncated PDF: pages 1-2: {FONTS_LOST}; download or copy it again"
    assert "no text left" not in message


def test_a_truncated_pdf_that_lost_some_pages_fonts_names_them(tmp_path):
    # page 1 keeps its own resources; page 2 names a resources object written last, lost with the file's end
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R 5 0 R] /Count 2 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 7 0 R >> >> "
               b"/Contents 4 0 R >>", stream(show(b"Kept page with its font.")),
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources 8 0 R /Contents 6 0 R >>",
               stream(show(b"Lost page.")), FONT, b"<< /Font << /F1 7 0 R >> >>"]
    data = assemble(objects)
    document = load_document(write(tmp_path, "cut.pdf", data[: data.index(b"8 0 obj")]))
    assert "Kept page with its font." in document.text and not document.pages[1].text
    assert document.warnings[0] == f"truncated or damaged PDF: read the objects that remained; page 2: {FONTS_LOST}"


def test_an_empty_printed_label_is_the_physical_page_number(tmp_path):
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf(["Cover.", "Blank label.", "Preface."]))))
    # pages 1-2: a range with neither style nor prefix (printed labels ""), page 3 on: roman
    writer._root_object[NameObject("/PageLabels")] = DictionaryObject({NameObject("/Nums"): ArrayObject([
        NumberObject(0), DictionaryObject(), NumberObject(2), DictionaryObject({NameObject("/S"): NameObject("/r")})])})
    out = io.BytesIO()
    writer.write(out)
    assert list(PdfReader(io.BytesIO(out.getvalue())).page_labels) == ["", "", "i"], "the fixture has empty labels"
    document = load_document(write(tmp_path, "labels.pdf", out.getvalue()))
    assert [p.label for p in document.pages] == ["1", "2", "i"]
    assert [p.label for p in load_document(tmp_path / "labels.pdf", pages="2-i").pages] == ["2", "i"]


def test_the_search_for_lost_fonts_is_bounded(tmp_path, monkeypatch):
    """It decodes the content streams of the pages without text, which a hostile file makes large: past its time
    limit the refusal falls back to the general message."""
    import time

    import locks_chat.ingest.pdf as pdf

    def slow(reader, index):
        time.sleep(2)
        return True

    monkeypatch.setattr(pdf, "FONT_CHECK_LIMIT_S", 0.2)
    monkeypatch.setattr(pdf, "text_without_fonts", slow)
    _, cut = fonts_at_the_end([b"The keeper is Ann Marsh."])
    start = time.monotonic()
    with pytest.raises(NoTextError, match="no text left in what remains"):
        load_document(write(tmp_path, "cut.pdf", cut))
    assert time.monotonic() - start < 1.5


def test_pypdf_messages_are_kept_once_each_and_at_most_a_hundred():
    """A hostile file (deeply nested dictionaries) made pypdf log 100,000 distinct messages, each compared with
    every one kept: 8 s of the fuzzed load's CPU time went there, close to the time limit."""
    from locks_chat.ingest.pdf_problems import KEPT_PROBLEMS, PdfProblems

    problems = PdfProblems()
    problems.add("Error reading PDF file.")
    problems.add("Error reading PDF file.")
    with problems.reading(0):
        problems.add("Error reading PDF file.")  # the same message on a page is that page's
    assert [(p.page, p.message) for p in problems.items] == [(None, "Error reading PDF file."),
                                                             (0, "Error reading PDF file.")]
    for n in range(10_000):
        problems.add(f"Expecting a NameObject for key but found {n}")
    assert len(problems.items) == KEPT_PROBLEMS == 100
