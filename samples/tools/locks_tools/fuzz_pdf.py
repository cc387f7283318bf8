"""Hypothesis strategies for hostile PDF bytes, for fuzzing ``load_document`` (``tests/ingest/test_ingest_fuzz.py``,
``samples/tools/fuzz_ingest.py``).

PDFs are assembled by hand (:func:`assemble`: numbered objects, a classic cross-reference table, a trailer), so
each family can break exactly one thing: page trees with ``/Parent`` and ``/Kids`` cycles or a DAG that repeats
pages, arrays and dictionaries nested thousands deep, streams whose ``/Length`` or ``/Filter`` is the stream
itself, forms that draw themselves, fonts whose ``/ToUnicode`` ranges or ``/W`` widths span billions of codes,
filter chains over random data, page labels and titles with control characters, encryption dictionaries with
random fields, and random bytes after a valid ``%PDF-`` header. The mutated family takes a valid PDF of any
family (or one pypdf wrote, compressed) and flips, inserts, deletes, duplicates or truncates bytes, or replaces
numbers and names, as the files behind PDF readers' bug reports look.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from hypothesis import strategies as st

HEADER = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n"
FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
INTERESTING_INTS = (0, 1, -1, 2, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**63, -(2**63), 10**30)
_NAMES = [b"/Type", b"/Page", b"/Pages", b"/Kids", b"/Parent", b"/Count", b"/Contents", b"/Resources", b"/Font",
          b"/Length", b"/Filter", b"/FlateDecode", b"/XObject", b"/Form", b"/Root", b"/Size", b"/Prev", b"/Encrypt",
          b"/ToUnicode", b"/Widths", b"/FirstChar", b"/Nums", b"/PageLabels", b"/S", b"/P", b"/St", b"/Subtype"]
_TOKENS = [b"obj", b"endobj", b"stream", b"endstream", b"xref", b"trailer", b"startxref", b"%%EOF", b"<<", b">>",
           b"[", b"]", b"R", b"null", b"true", b"(", b")", b"<", b">", b"BT", b"ET", b"Tj", b"TJ", b"Tf", b"Do",
           b"\n", b" ", *_NAMES]


def assemble(objects: Sequence[bytes], *, trailer: bytes = b"", header: bytes = HEADER) -> bytes:
    """A PDF of ``objects`` numbered from 1 (object 1 is the catalog), with a correct cross-reference table.

    Args:
        objects (Sequence[bytes]): each object's body, without ``n 0 obj`` / ``endobj``.
        trailer (bytes): more trailer entries (``/Info 6 0 R``).
        header (bytes): the first bytes of the file.
    """
    out, offsets = bytearray(header), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R %s>>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, trailer, xref)
    return bytes(out)


def stream(data: bytes, entries: bytes = b"", length: bytes | None = None) -> bytes:
    """A stream object's body: ``<< /Length n entries >> stream ... endstream`` (``length`` replaces ``n``)."""
    return b"<< /Length %s %s >>\nstream\n%s\nendstream" % (length or str(len(data)).encode(), entries, data)


def show(text: bytes) -> bytes:
    """A content stream showing ``text`` in ``/F1``."""
    return b"BT /F1 12 Tf 72 720 Td (" + text.replace(b"\\", b"\\\\").replace(b")", b"\\)") + b") Tj ET"


def simple_objects(text: bytes = b"Hello fuzz", resources: bytes = b"<< /Font << /F1 5 0 R >> >>") -> list[bytes]:
    """Catalog (1), page tree (2), one page (3), its content (4) and font (5) of a valid one-page PDF."""
    return [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources %s /Contents 4 0 R >>" % resources,
        stream(show(text)),
        FONT,
    ]


@st.composite
def page_tree_cycles(draw) -> bytes:
    """``/Parent`` and ``/Kids`` cycles, a ``/Kids`` DAG that repeats its pages, ``/Count`` lies."""
    objects = simple_objects()
    kids = draw(st.lists(st.sampled_from([b"1 0 R", b"2 0 R", b"3 0 R", b"6 0 R", b"99 0 R", b"null"]), max_size=6))
    count = draw(st.sampled_from(INTERESTING_INTS))
    objects[1] = b"<< /Type /Pages /Kids [3 0 R %s] /Count %d >>" % (b" ".join(kids), count)
    parent = draw(st.sampled_from([b"2 0 R", b"3 0 R", b"6 0 R", b"1 0 R"]))
    objects[2] = objects[2].replace(b"/Parent 2 0 R", b"/Parent " + parent)
    levels = draw(st.integers(0, 40))
    # object 6: a /Pages node whose kids are two references to the same node, ``levels`` deep: 2**levels pages
    first = 7 + len(objects) - 5
    objects.append(b"<< /Type /Pages /Kids [%d 0 R %d 0 R] /Count 2 /Parent 2 0 R >>" % (first, first))
    for level in range(levels):
        target = first + 1 if level < levels - 1 else 3
        objects.append(b"<< /Type /Pages /Kids [%d 0 R %d 0 R] /Count 2 >>" % (target, target))
        first += 1
    return assemble(objects)


@st.composite
def deep_nesting(draw) -> bytes:
    """Arrays, dictionaries or content-stream operands nested up to 200,000 deep, where the reader looks."""
    depth = draw(st.sampled_from([2, 50, 101, 999, 1001, 5000, 100_000, 200_000]))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b"<< /A ", b" >>"), (b"<< /A [", b"] >>")]))
    nested = opener * depth + b"0" + closer * depth
    place = draw(st.sampled_from(["resources", "content", "mediabox", "font", "catalog"]))
    objects = simple_objects()
    if place == "resources":
        objects[2] = objects[2].replace(b"/Resources", b"/Extra %s /Resources" % nested)
    elif place == "content":
        objects[3] = stream(b"BT /F1 12 Tf " + b"[" * depth + b"(deep) " + b"]" * depth + b" TJ ET")
    elif place == "mediabox":
        objects[2] = objects[2].replace(b"[0 0 612 792]", nested)
    elif place == "font":
        objects[4] = FONT[:-2] + b"/Widths " + nested + b" >>"
    else:
        objects[0] = b"<< /Type /Catalog /Pages 2 0 R /Outlines %s >>" % nested
    return assemble(objects)


@st.composite
def self_references(draw) -> bytes:
    """Streams whose ``/Length`` or ``/Filter`` is the stream itself, contents that are the page, a form drawing
    itself, resources that contain themselves."""
    objects = simple_objects(resources=b"<< /Font << /F1 5 0 R >> /XObject << /X0 6 0 R /X1 7 0 R >> >>")
    kind = draw(st.sampled_from(["length", "length-chain", "filter", "contents-page", "contents-array", "form",
                                 "forms-mutual", "resources", "font-encoding"]))
    drawing = b"/X0 Do /X1 Do " + show(b"page text")
    objects[3] = stream(drawing)
    form = stream(b"/X0 Do " + show(b"form"), b"/Type /XObject /Subtype /Form /BBox [0 0 9 9] "
                  b"/Resources << /Font << /F1 5 0 R >> /XObject << /X0 6 0 R >> >>")
    objects += [form, stream(b"/X0 Do", b"/Type /XObject /Subtype /Form /BBox [0 0 9 9] /Resources 3 0 R")]
    if kind == "length":
        objects[3] = stream(drawing, length=b"4 0 R")
    elif kind == "length-chain":
        objects[3] = stream(drawing, length=b"8 0 R")
        objects.append(b"8 0 R")
    elif kind == "filter":
        objects[3] = stream(drawing, b"/Filter 4 0 R /DecodeParms 4 0 R")
    elif kind == "contents-page":
        objects[2] = objects[2].replace(b"/Contents 4 0 R", b"/Contents 3 0 R")
    elif kind == "contents-array":
        repeat = draw(st.integers(1, 5000))
        objects[2] = objects[2].replace(b"/Contents 4 0 R", b"/Contents [%s]" % (b"4 0 R " * repeat + b"3 0 R"))
    elif kind == "forms-mutual":
        objects[5] = objects[5].replace(b"/X0 6 0 R", b"/X0 7 0 R")
        objects[6] = objects[6].replace(b"/Resources 3 0 R", b"/Resources << /XObject << /X0 6 0 R >> >>")
    elif kind == "resources":
        objects[2] = objects[2].replace(b"/Resources <<", b"/Resources 8 0 R /R <<")
        objects.append(b"<< /Font << /F1 5 0 R >> /XObject 8 0 R /Self 8 0 R >>")
    elif kind == "font-encoding":
        objects[4] = FONT[:-2] + b"/Encoding 5 0 R /ToUnicode 5 0 R /FontDescriptor 5 0 R >>"
    return assemble(objects)


@st.composite
def hostile_fonts(draw) -> bytes:
    """``/ToUnicode`` CMaps and ``/W`` or ``/Widths`` arrays whose ranges span up to 2**32 codes."""
    low, high = sorted(draw(st.lists(st.sampled_from([0, 1, 0xFF, 0xFFFF, 0x10000, 0xFFFFFFFF]), min_size=2,
                                     max_size=2)))
    digits = draw(st.sampled_from([2, 4, 8]))
    hexa = lambda n: b"<%0*X>" % (digits, n)  # noqa: E731
    cmap = (b"/CIDInit /ProcSet findresource begin 12 dict begin begincmap 1 begincodespacerange "
            b"%s %s endcodespacerange 2 beginbfrange %s %s %s %s %s [<0041> <0042>] endbfrange "
            b"1 beginbfchar %s <D800DC00> endbfchar endcmap end end"
            % (hexa(0), hexa(high), hexa(low), hexa(high), hexa(0x41), hexa(low), hexa(high), hexa(low)))
    widths = b"[%d [500 600] %d %d 700]" % (low, low, high)
    cid = (b"<< /Type /Font /Subtype /Type0 /BaseFont /Fuzz /Encoding /Identity-H /ToUnicode 6 0 R "
           b"/DescendantFonts [<< /Type /Font /Subtype /CIDFontType2 /BaseFont /Fuzz /W %s "
           b"/CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> >>] >>" % widths)
    simple = (b"<< /Type /Font /Subtype /Type1 /BaseFont /Fuzz /FirstChar %d /LastChar %d /Widths [1 2 3] "
              b"/ToUnicode 6 0 R /Encoding << /Differences [%d /A /B %d /C] >> >>" % (high, low, high, -low))
    objects = simple_objects(text=draw(st.binary(max_size=40)))
    objects[4] = draw(st.sampled_from([cid, simple]))
    objects.append(stream(cmap))
    return assemble(objects)


_FILTERS = [b"/FlateDecode", b"/LZWDecode", b"/ASCII85Decode", b"/ASCIIHexDecode", b"/RunLengthDecode",
            b"/DCTDecode", b"/CCITTFaxDecode", b"/JBIG2Decode", b"/Crypt", b"/Fl", b"/AHx", b"/Nonsense"]


@st.composite
def filter_chains(draw) -> bytes:
    """Content streams under chains of filters with adversarial ``/DecodeParms``, over random or valid data, and
    Flate bombs (a few KB that inflate to 100 MB)."""
    filters = draw(st.lists(st.sampled_from(_FILTERS), min_size=1, max_size=5))
    parms = b"<< /Predictor %d /Columns %d /Colors %d /BitsPerComponent %d /K %d >>" % tuple(
        draw(st.sampled_from(INTERESTING_INTS + (15, 12, 2))) for _ in range(5))
    payload = draw(st.sampled_from(["random", "flate", "bomb"]))
    if payload == "random":
        data = draw(st.binary(max_size=2000))
    elif payload == "flate":
        data = zlib.compress(show(draw(st.binary(max_size=200))))
    else:
        data = zlib.compress(b"0" * draw(st.sampled_from([1 << 20, 80_000_000, 100_000_000])), 9)
    entries = b"/Filter [%s] /DecodeParms [%s]" % (b" ".join(filters), b" ".join([parms] * len(filters)))
    objects = simple_objects()
    objects[3] = stream(data, entries)
    return assemble(objects)


def _label_text() -> st.SearchStrategy[bytes]:
    text = st.text(st.characters(max_codepoint=0x3000), max_size=30)
    return text.map(lambda s: b"<FEFF" + s.encode("utf-16-be", "surrogatepass").hex().encode() + b">") | st.binary(
        max_size=30).map(lambda b: b"(" + b.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)") + b")")


@st.composite
def labels_and_info(draw) -> bytes:
    """``/PageLabels`` number trees (prefixes with control characters, odd starts and styles, cyclic ``/Kids``)
    and ``/Info`` titles of any characters, over a few pages."""
    pages = draw(st.integers(1, 4))
    objects = simple_objects()
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b"3 0 R " * pages, pages)
    entry = b"<< /S %s /P %s /St %d >>" % (draw(st.sampled_from([b"/r", b"/R", b"/A", b"/a", b"/D", b"/X", b"1"])),
                                           draw(_label_text()), draw(st.sampled_from(INTERESTING_INTS)))
    nums = b"/Nums [0 %s %d << /P %s >>]" % (entry, draw(st.integers(-2, 5)), draw(_label_text()))
    tree = draw(st.sampled_from([nums, b"/Kids [7 0 R]", b"/Kids [6 0 R] " + nums]))
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R /PageLabels 6 0 R >>"
    objects.append(b"<< %s >>" % tree)
    objects.append(b"<< /Limits [0 9] /Kids [7 0 R 6 0 R] %s >>" % nums)
    objects.append(b"<< /Title %s /Author %s >>" % (draw(_label_text()), draw(_label_text())))
    return assemble(objects, trailer=b"/Info 8 0 R ")


@st.composite
def encrypt_dicts(draw) -> bytes:
    """An ``/Encrypt`` dictionary with random handler, version, revision, key length and keys."""
    number = st.sampled_from(INTERESTING_INTS + (4, 5, 6, 40, 128))
    fields = b"/Filter %s /V %d /R %d /Length %d /P %d /O <%s> /U <%s> /OE <%s> /UE <%s> /Perms <%s>" % (
        draw(st.sampled_from([b"/Standard", b"/Adobe.PubSec", b"/Nonsense", b"1"])),
        draw(number), draw(number), draw(number), draw(number),
        *(draw(st.binary(max_size=48)).hex().encode() for _ in range(5)))
    crypt = b" /CF << /StdCF << /CFM %s /Length %d >> >> /StmF /StdCF /StrF /StdCF" % (
        draw(st.sampled_from([b"/V2", b"/AESV2", b"/AESV3", b"/None", b"/X"])), draw(number))
    objects = simple_objects()
    objects.append(b"<< %s%s >>" % (fields, crypt if draw(st.booleans()) else b""))
    return assemble(objects, trailer=b"/Encrypt 6 0 R /ID [<%s> <00>] " % draw(st.binary(max_size=16)).hex().encode())


@st.composite
def header_then_random(draw) -> bytes:
    """A valid ``%PDF-1.x`` header followed by random bytes, or by a soup of PDF tokens and numbers."""
    header = b"%%PDF-1.%d\n" % draw(st.integers(0, 9))
    soup = st.lists(st.sampled_from(_TOKENS) | st.integers(-5, 99).map(lambda n: b" %d " % n), max_size=300)
    return header + draw(st.binary(max_size=4000) | soup.map(b"".join))


def hostile_pdfs() -> st.SearchStrategy[bytes]:
    """One PDF of any hand-built family above (not mutated)."""
    return st.one_of(page_tree_cycles(), deep_nesting(), self_references(), hostile_fonts(), filter_chains(),
                     labels_and_info(), encrypt_dicts())
