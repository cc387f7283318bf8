"""Byte-level mutations of valid documents (or of an EPUB's members), and the valid PDFs they start from, for
fuzzing ``load_document``.

:func:`mutated` applies one to eight edits to a seed: flip a bit, overwrite or insert random bytes, delete,
duplicate or truncate a span, replace a number with a boundary value (``2**31``, ``-1``, ``10**30``), replace a
name with another one the reader looks up, insert a PDF token, or splice in a span of another seed. The PDF seeds
(:func:`pdf_seeds`) come from three writers: hand-assembled (classic cross-reference table, or an object stream
with a cross-reference stream), pypdf (compressed content, page labels, AES-256 and RC4 encryption) and fpdf2.
"""

from __future__ import annotations

import functools
import io
import re
import struct
import zipfile
import zlib
from collections.abc import Sequence

from hypothesis import strategies as st

from locks_tools.fuzz_docs import zip_bytes
from locks_tools.fuzz_pdf import _NAMES, _TOKENS, HEADER, INTERESTING_INTS, assemble, show, simple_objects, stream

_EDITS = ("flip", "overwrite", "insert", "delete", "duplicate", "truncate", "number", "name", "token", "splice")


@st.composite
def mutated(draw, seeds: Sequence[bytes]) -> bytes:
    """One of ``seeds`` after one to eight random edits (module docstring)."""
    return _edited(draw, bytearray(draw(st.sampled_from(seeds))), seeds)


@st.composite
def mutated_members(draw, seeds: Sequence[bytes]) -> bytes:
    """One of ``seeds`` (zip archives) with one member edited as by :func:`mutated`, zipped again; one time in
    four the archive's own bytes are edited instead."""
    seed = draw(st.sampled_from(seeds))
    if draw(st.integers(0, 3)) == 0:
        return _edited(draw, bytearray(seed), seeds)
    with zipfile.ZipFile(io.BytesIO(seed)) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    index = draw(st.integers(0, len(members) - 1))
    name, content = members[index]
    members[index] = (name, _edited(draw, bytearray(content), [member for _, member in members]))
    return zip_bytes(members)


def _edited(draw, data: bytearray, seeds: Sequence[bytes]) -> bytes:
    for _ in range(draw(st.integers(1, 8))):
        edit = draw(st.sampled_from(_EDITS))
        at = draw(st.integers(0, len(data)))
        span = draw(st.integers(1, 256))
        if edit == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif edit == "overwrite":
            data[at : at + span] = draw(st.binary(min_size=1, max_size=span))
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif edit == "delete":
            del data[at : at + span]
        elif edit == "duplicate":
            data[at:at] = data[at : at + span] * draw(st.integers(1, 100))
        elif edit == "truncate":
            del data[at:]
        elif edit in ("number", "name"):
            pattern = rb"-?\d+" if edit == "number" else rb"/[A-Za-z]\w*"
            found = list(re.finditer(pattern, bytes(data)))
            if found:
                match = found[draw(st.integers(0, len(found) - 1))]
                new = b"%d" % draw(st.sampled_from(INTERESTING_INTS)) if edit == "number" else draw(
                    st.sampled_from(_NAMES))
                data[match.start() : match.end()] = new
        elif edit == "token":
            data[at:at] = b" " + draw(st.sampled_from(_TOKENS)) + b" "
        elif edit == "splice":
            other = draw(st.sampled_from(seeds))
            start = draw(st.integers(0, len(other)))
            data[at:at] = other[start : start + span]
    return bytes(data)


def assemble_compressed(objects: Sequence[bytes]) -> bytes:
    """A PDF 1.5 of ``objects`` numbered from 1 (object 1 is the catalog): objects other than the catalog and
    streams packed in one object stream, found through a cross-reference stream (``/W [1 4 2]``)."""
    out = bytearray(HEADER)
    count = len(objects)
    objstm, xref = count + 1, count + 2
    entries: dict[int, tuple[int, int, int]] = {}
    packed = [n for n in range(2, count + 1) if b"stream\n" not in objects[n - 1]]
    for number in range(1, count + 1):
        if number not in packed:
            entries[number] = (1, len(out), 0)
            out += b"%d 0 obj\n%s\nendobj\n" % (number, objects[number - 1])
    heads, body = [], bytearray()
    for index, number in enumerate(packed):
        heads.append(b"%d %d" % (number, len(body)))
        body += objects[number - 1] + b"\n"
        entries[number] = (2, objstm, index)
    head = b" ".join(heads) + b"\n"
    entries[objstm] = (1, len(out), 0)
    packed_stream = stream(zlib.compress(head + body), b"/Type /ObjStm /N %d /First %d /Filter /FlateDecode" % (
        len(packed), len(head)))
    out += b"%d 0 obj\n%s\nendobj\n" % (objstm, packed_stream)
    entries[xref] = (1, len(out), 0)
    rows = b"\x00\x00\x00\x00\x00\xff\xff" + b"".join(struct.pack(">BIH", *entries[n]) for n in range(1, xref + 1))
    xref_stream = stream(zlib.compress(rows), b"/Type /XRef /Size %d /W [1 4 2] /Root 1 0 R /Filter /FlateDecode"
                         % (xref + 1))
    out += b"%d 0 obj\n%s\nendobj\nstartxref\n%d\n%%%%EOF\n" % (xref, xref_stream, entries[xref][1])
    return bytes(out)


def _three_pages() -> list[bytes]:
    """Three pages of text with printed labels i, ii, 1 and a title."""
    objects = simple_objects(b"first page")
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R /PageLabels << /Nums [0 << /S /r >> 2 << /S /D >>] >> >>"
    objects[1] = b"<< /Type /Pages /Kids [3 0 R 6 0 R 8 0 R] /Count 3 >>"
    for number, text in ((6, b"second page"), (8, b"third page")):
        objects.append(objects[2].replace(b"4 0 R", b"%d 0 R" % (number + 1)))
        objects.append(stream(show(text)))
    objects.append(b"<< /Title (Fuzz seed) >>")
    return objects


def _pypdf_written(data: bytes, password: str | None = None, algorithm: str = "AES-256") -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    for page in writer.pages:
        page.compress_content_streams()
    writer.set_page_label(0, 0, style="/R", prefix="A-", start=3)
    if password is not None:
        writer.encrypt(user_password=password, owner_password="owner", algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def _fpdf_written() -> bytes:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    for text in ("A page written by fpdf2.", "Caf\xe9 na\xefve - second page."):
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    return bytes(pdf.output())


@functools.cache
def pdf_seeds() -> tuple[bytes, ...]:
    """The valid PDFs the mutated family starts from (module docstring); built once per process."""
    plain = assemble(_three_pages(), trailer=b"/Info 10 0 R ")
    return (
        assemble(simple_objects()),
        plain,
        assemble_compressed(_three_pages()),
        _pypdf_written(plain),
        _pypdf_written(plain, password=""),
        _pypdf_written(plain, password="secret", algorithm="RC4-128"),
        _fpdf_written(),
    )
