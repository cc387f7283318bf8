"""Hypothesis strategies for hostile EPUB, text and Markdown bytes, for fuzzing ``load_document``.

EPUBs are zip archives written member by member (:func:`zip_bytes`), so names the EPUB writers never produce are
possible: a package path or manifest ``href`` with ``../``, an absolute path, a URL or a drive letter, spine
entries that name nothing, chapters in another encoding than they declare, with control characters, nested
thousands deep or with an entity-expansion DTD, and huge members: declared past the unpacked-size cap, declared
smaller than they inflate to, or really inflating to megabytes (from kilobytes, or incompressible). Text is a
concatenation of segments each in its own encoding (UTF-8/16/32, cp1252, Shift-JIS, KOI8-R, ...), raw bytes and
control characters (ESC sequences, NUL, lone CR, form feeds, U+2028, BOMs in the middle), sometimes repeated to a
megabyte.
"""

from __future__ import annotations

import functools
import io
import posixpath
import random
import struct
import warnings
import zipfile
from collections.abc import Sequence
from xml.sax.saxutils import escape, quoteattr

from hypothesis import strategies as st

ENCODINGS = ("utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "cp1252", "latin-1", "cp1251",
             "koi8-r", "shift_jis", "gb18030", "big5", "cp437", "mac-roman", "iso-8859-7", "utf-7")
CONTROLS = ("\x00", "\x1b[31m", "\x1b]0;title\x07", "\x1b[2J", "\r", "\r\n", "\f", "\x0b", "\x85", "\u2028",
            "\ufeff", "\u200b", "\x7f", "\x08", "\u202e", "\xad", "\ufb01")
BAD_PATHS = ("../x.xhtml", "../../etc/x.xhtml", "/x.xhtml", "/etc/hostname", "C:\\x.xhtml", "a/../../x.xhtml",
             "file:///etc/hostname", "http://example.invalid/x.xhtml", "%2e%2e/x.xhtml", "x.xhtml#frag", "", ".",
             "..", "a//b.xhtml", "\u00e9t\u00e9.xhtml", "x" * 300 + ".xhtml")
_CONTAINER = ('<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:'
              'container"><rootfiles><rootfile full-path=%s media-type="application/oebps-package+xml"/>'
              "</rootfiles></container>")
_OPF = ('<?xml version="1.0" encoding="utf-8"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
        'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">x'
        "</dc:identifier><dc:title>%s</dc:title><dc:language>en</dc:language></metadata><manifest>%s</manifest>"
        "<spine>%s</spine></package>")
_LAUGHS = ('<!DOCTYPE html [<!ENTITY a "aaaaaaaaaa">' + "".join(
    f'<!ENTITY {b} "{("&" + a + ";") * 10}">' for a, b in zip("abcdefgh", "bcdefghi", strict=True)) + "]>")


def mixed_text(max_segments: int = 40) -> st.SearchStrategy[bytes]:
    """Bytes of text segments in mixed encodings, raw bytes and control characters (module docstring)."""
    segment = st.tuples(st.text(max_size=80), st.sampled_from(ENCODINGS)).map(
        lambda pair: pair[0].encode(pair[1], errors="replace"))
    control = st.sampled_from(CONTROLS).map(lambda c: c.encode("utf-8"))
    return st.lists(segment | control | st.binary(max_size=64), max_size=max_segments).map(b"".join)


# Hypothesis keeps every value a strategy returns until its run ends, so large bytes are made from small draws
# in plain code (``REPEATS`` times a drawn text, :func:`_big_body`), not returned by a ``map``
REPEATS = (1, 1, 1, 2, 100, 1000)
"""how many times a drawn text is repeated into a file: mostly once, sometimes to about a megabyte"""


@st.composite
def text_files(draw) -> tuple[bytes, str]:
    """A text or Markdown file's bytes and name: mixed text, maybe after a BOM or a Markdown heading."""
    prefix = draw(st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\xff\xfe\x00\x00", b"# ",
                                   b"# Title\x1b[1m\n\n", b"---\ntitle: x\n---\n"]))
    name = draw(st.sampled_from(["doc.txt", "doc.md", "doc.markdown", "doc", "doc.TXT", "doc.rst"]))
    return prefix + draw(mixed_text()) * draw(st.sampled_from(REPEATS)), name


def zip_bytes(members: Sequence[tuple[str, bytes]], declared: dict[int, int] | None = None) -> bytes:
    """A zip archive of ``members`` (name, content) in order, ``mimetype`` stored and the rest deflated.

    Args:
        members (Sequence[tuple[str, bytes]]): names are written as given (``../x``, ``/x`` included).
        declared (dict[int, int] | None): member index -> the unpacked size (bytes) its headers claim instead
            of the true one.
    """
    out = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(out, "w") as archive:
        warnings.simplefilter("ignore")  # duplicate names are wanted
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if name == "mimetype" else zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    data = bytearray(out.getvalue())
    for signature, field in ((b"PK\x01\x02", 24), (b"PK\x03\x04", 22)):
        start = 0
        for index in range(len(members)):
            start = data.find(signature, start)
            if index in (declared or {}):
                data[start + field : start + field + 4] = struct.pack("<I", declared[index])
            start += 4
    return bytes(data)


def _big_body(kind: str, number: int) -> bytes:
    """Megabytes of XHTML: ``"bomb"``, ``number`` repeated paragraphs (compressed over 1000x); ``"noise"``,
    ``number`` pseudo-random bytes as hexadecimal words (compressed about 2x); ``""``, nothing."""
    if kind == "bomb":
        return b"<p>all work and no play</p>" * number
    if kind == "noise":
        return b"<p>%s</p>" % random.Random(number).randbytes(number % (1 << 18)).hex(" ", 4).encode()
    return b""


def _chapter(body: bytes, encoding: str, claimed: str, depth: int, laughs: bool) -> bytes:
    head = f'<?xml version="1.0" encoding="{claimed}"?>' + (_LAUGHS if laughs else "")
    nested = "<div>" * depth + "%s" + "</div>" * depth
    html = head + '<html xmlns="http://www.w3.org/1999/xhtml"><body>' + nested + ("&i;" if laughs else "")
    html += "</body></html>"
    before, after = html.split("%s")
    return before.encode(encoding, errors="replace") + body + after.encode(encoding, errors="replace")


def _mostly(good, bad: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` three times in four, else a draw from ``bad``."""
    return st.integers(0, 3).flatmap(lambda n: bad if n == 0 else st.just(good))


def _member_name(opf_path: str, href: str) -> st.SearchStrategy[str]:
    """Where a manifest ``href`` is stored in the zip: resolved against the package's folder (as readers do),
    or stored as written."""
    folder = posixpath.dirname(opf_path)
    resolved = posixpath.normpath(posixpath.join(folder, href))
    return _mostly(resolved, st.sampled_from([posixpath.join(folder, href), href]))


@st.composite
def epub_files(draw) -> bytes:
    """An EPUB zip with hostile paths, spine, chapters and member sizes (module docstring)."""
    bad_path = st.sampled_from(BAD_PATHS)
    opf_path = draw(_mostly("OEBPS/content.opf", bad_path))
    quote = quoteattr if draw(_mostly(True, st.just(False))) else (lambda s: f'"{s}"')
    items, refs, members = [], [], []
    for index in range(draw(st.integers(1, 4))):
        href = draw(_mostly(f"ch{index}.xhtml", bad_path))
        encoding = draw(_mostly("utf-8", st.sampled_from(ENCODINGS)))
        claimed = draw(_mostly(encoding, st.sampled_from(ENCODINGS + ("nonsense",))))
        depth = draw(st.sampled_from([0, 1, 300, 5000, 100_000]))
        big = draw(_mostly("", st.sampled_from(["bomb", "noise"])))
        number = draw(st.sampled_from([40_000, 300_000]) if big == "bomb" else st.integers(0, 2**32))
        body = b"<p>Chapter %d.</p>" % index + draw(mixed_text(10)) + _big_body(big, number)
        chapter = _chapter(body, encoding, claimed, depth, draw(_mostly(False, st.just(True))))
        members.append((draw(_member_name(opf_path, href)), chapter))
        media = draw(_mostly("application/xhtml+xml", st.sampled_from(["image/png", "text/css", "x/y", ""])))
        items.append(f"<item id={quote(f'c{index}')} href={quote(href)} media-type={quote(media)}/>")
        refs.append(f"<itemref idref={quote(draw(_mostly(f'c{index}', st.sampled_from(['missing', '', 'c0']))))}/>")
    title = draw(st.text(max_size=40))
    opf = _OPF % (escape(title) if draw(_mostly(True, st.just(False))) else title, "".join(items), "".join(refs))
    head = [("mimetype", b"application/epub+zip"), ("META-INF/container.xml", (_CONTAINER % quote(opf_path)).encode()),
            (draw(_mostly(opf_path, st.just("OEBPS/content.opf"))), opf.encode("utf-8", errors="replace"))]
    members = head + members
    sizes = st.dictionaries(st.integers(0, len(members) - 1), st.sampled_from([0, 1, 100, 2**30 + 1, 2**32 - 1]),
                            min_size=1, max_size=2)
    return zip_bytes(members, draw(_mostly({}, sizes)))


@functools.cache
def epub_seeds() -> tuple[bytes, ...]:
    """Valid EPUBs ebooklib writes (a cover and two chapters; one with the table of contents in the spine)."""
    from ebooklib import epub

    seeds = []
    for nav_in_spine in (False, True):
        book = epub.EpubBook()
        book.set_identifier("fuzz-seed")
        book.set_title("A Fuzz Seed")
        book.set_language("en")
        chapters = []
        for index, text in enumerate(("It was a dark night.", "Caf\xe9, na\xefve, \ufb01re."), start=1):
            chapter = epub.EpubHtml(title=f"Chapter {index}", file_name=f"chapter_{index}.xhtml", lang="en")
            chapter.content = f"<html><body><h1>Chapter {index}</h1><p>{text}</p></body></html>"
            book.add_item(chapter)
            chapters.append(chapter)
        book.toc = tuple(chapters)
        book.add_item(epub.EpubNcx())
        nav = epub.EpubNav()
        book.add_item(nav)
        book.spine = [nav, *chapters] if nav_in_spine else chapters
        out = io.BytesIO()
        epub.write_epub(out, book)
        seeds.append(out.getvalue())
    return tuple(seeds)


def header_then_random() -> st.SearchStrategy[tuple[bytes, str]]:
    """Random bytes after a valid EPUB start (a stored ``mimetype`` member), a BOM, or a Markdown heading."""
    epub_start = zip_bytes([("mimetype", b"application/epub+zip")])[:-22]  # the member, no central directory
    prefix = st.sampled_from([(epub_start, "book.epub"), (epub_start, "book"), (b"\xef\xbb\xbf", "doc.txt"),
                              (b"\xff\xfe", "doc.txt"), (b"# Heading\n\n", "doc.md")])
    return st.tuples(prefix, st.binary(max_size=4000)).map(lambda t: (t[0][0] + t[1], t[0][1]))
