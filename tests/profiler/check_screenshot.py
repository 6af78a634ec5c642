#!/usr/bin/python3
"""Checks a headless-Chromium screenshot of a kiln profile report (standard library only).

Usage:
  check_screenshot.py SHOT.png --header include/kiln/profiler/report_html.hpp [--phases 5]
                      [--min-phase-pixels 400] [--min-memory-pixels 2000] [--min-colours 64]
  check_screenshot.py --self-test

It decodes the PNG itself (8-bit RGB or RGBA, non-interlaced, all five filter types: no PIL on
the test machines) and checks that
  (a) the page is not blank: many distinct colours;
  (b) each phase colour from report_html.hpp (phase_colours) covers at least N pixels, i.e. the
      stacked bars were drawn, not only the legend swatches;
  (c) the memory chart's area and line colours appear.
The colours are read from the header, so the test follows any change of palette.
Exits 0 when all hold, 1 with one line per failed check otherwise, 2 on bad input.
"""

import argparse
import collections
import os
import re
import struct
import sys
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class png_error(Exception):
    pass


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def unfilter_row(kind, raw, prev, bpp):
    """Undoes one scanline's filter (PNG spec section 9). `prev` is the previous unfiltered row
    (all zeros for the first). Returns the unfiltered row as a bytearray."""
    n = len(raw)
    if kind == 0:  # None
        return bytearray(raw)
    if kind == 2:  # Up: independent per byte, so one pass over both rows
        return bytearray((r + p) & 0xFF for r, p in zip(raw, prev))
    row = bytearray(raw)
    if kind == 1:  # Sub
        for i in range(bpp, n):
            row[i] = (row[i] + row[i - bpp]) & 0xFF
    elif kind == 3:  # Average
        for i in range(n):
            left = row[i - bpp] if i >= bpp else 0
            row[i] = (row[i] + ((left + prev[i]) >> 1)) & 0xFF
    elif kind == 4:  # Paeth
        for i in range(n):
            if i >= bpp:
                row[i] = (row[i] + paeth(row[i - bpp], prev[i], prev[i - bpp])) & 0xFF
            else:
                row[i] = (row[i] + prev[i]) & 0xFF  # paeth(0, b, 0) == b
    else:
        raise png_error("unknown filter type %d" % kind)
    return row


def decode_png(data):
    """Returns (width, height, channels, rows): rows is a list of bytearrays of width*channels."""
    if not data.startswith(PNG_SIGNATURE):
        raise png_error("not a PNG file (bad signature)")
    pos, header, idat = len(PNG_SIGNATURE), None, []
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if len(body) != length:
            raise png_error("truncated %s chunk" % kind.decode("latin-1"))
        pos += 12 + length  # length, type, body, CRC
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None:
        raise png_error("no IHDR chunk")
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6):
        raise png_error("only 8-bit RGB/RGBA is supported (depth %d, colour type %d)"
                        % (depth, colour_type))
    if interlace != 0:
        raise png_error("interlaced PNGs are not supported")
    channels = 3 if colour_type == 2 else 4
    stride = width * channels
    pixels = zlib.decompress(b"".join(idat))
    if len(pixels) < height * (stride + 1):
        raise png_error("image data is shorter than %dx%d" % (width, height))
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        prev = unfilter_row(pixels[start], pixels[start + 1:start + 1 + stride], prev, channels)
        rows.append(prev)
    return width, height, channels, rows


def colour_counts(rows, channels):
    """Counter of (r, g, b) over every pixel; alpha is ignored (screenshots are opaque)."""
    counts = collections.Counter()
    for row in rows:
        counts.update(zip(row[0::channels], row[1::channels], row[2::channels]))
    return counts


def near(counts, rgb, tolerance):
    """Pixels within `tolerance` per channel of rgb (absorbs colour-management rounding)."""
    r, g, b = rgb
    return sum(n for (cr, cg, cb), n in counts.items()
               if abs(cr - r) <= tolerance and abs(cg - g) <= tolerance and abs(cb - b) <= tolerance)


def parse_hex(text):
    text = text.lstrip("#")
    return tuple(int(text[i:i + 2], 16) for i in (0, 2, 4))


def colours_from_header(path):
    """phase_colours, memory_area_colour and memory_line_colour as written in report_html.hpp."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    block = re.search(r"phase_colours\s*=\s*\{(.*?)\};", source, re.S)
    area = re.search(r'memory_area_colour\s*=\s*"(#[0-9a-fA-F]{6})"', source)
    line = re.search(r'memory_line_colour\s*=\s*"(#[0-9a-fA-F]{6})"', source)
    if not (block and area and line):
        raise png_error("cannot find the colour constants in %s" % path)
    phases = [parse_hex(h) for h in re.findall(r'"(#[0-9a-fA-F]{6})"', block.group(1))]
    return phases, parse_hex(area.group(1)), parse_hex(line.group(1))


def check(args):
    with open(args.screenshot, "rb") as f:
        width, height, channels, rows = decode_png(f.read())
    counts = colour_counts(rows, channels)
    phases, area, line = colours_from_header(args.header)
    phases = phases[:args.phases]
    print("%s: %dx%d, %d channels, %d distinct colours" %
          (args.screenshot, width, height, channels, len(counts)))

    failures = []
    if len(counts) < args.min_colours:
        failures.append("the page looks blank: only %d distinct colours (want >= %d)"
                        % (len(counts), args.min_colours))
    for i, rgb in enumerate(phases):
        n = near(counts, rgb, args.tolerance)
        print("  phase %d colour #%02x%02x%02x: %d pixels" % ((i,) + rgb + (n,)))
        if n < args.min_phase_pixels:
            failures.append("phase %d colour #%02x%02x%02x covers %d pixels (want >= %d): "
                            "the stacked bars did not render" % ((i,) + rgb + (n, args.min_phase_pixels)))
    for name, rgb, minimum in (("memory area", area, args.min_memory_pixels),
                               ("memory line", line, args.min_line_pixels)):
        n = near(counts, rgb, args.tolerance)
        print("  %s colour #%02x%02x%02x: %d pixels" % ((name,) + rgb + (n,)))
        if n < minimum:
            failures.append("%s colour #%02x%02x%02x covers %d pixels (want >= %d): "
                            "the memory chart did not render" % ((name,) + rgb + (n, minimum)))
    for message in failures:
        print("FAIL: " + message, file=sys.stderr)
    if not failures:
        print("screenshot OK")
    return 1 if failures else 0


# ---- self-test: encode images with every filter type and decode them back ------------------------

def filter_row(kind, row, prev, bpp):
    out = bytearray(len(row))
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        predictor = (0, a, b, (a + b) >> 1, paeth(a, b, c))[kind]
        out[i] = (row[i] - predictor) & 0xFF
    return out


def encode_png(width, height, channels, rows):
    def chunk(kind, body):
        return (struct.pack(">I", len(body)) + kind + body +
                struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    raw, prev = bytearray(), bytearray(width * channels)
    for y, row in enumerate(rows):
        kind = y % 5  # cycle through all five filter types
        raw += bytes([kind]) + filter_row(kind, row, prev, channels)
        prev = row
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2 if channels == 3 else 6, 0, 0, 0)
    return (PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(bytes(raw))) +
            chunk(b"IEND", b""))


def self_test():
    seed = 12345
    for channels in (3, 4):
        width, height = 37, 23
        rows = []
        for _ in range(height):
            row = bytearray()
            for _ in range(width * channels):
                seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
                row.append(seed >> 16 & 0xFF)
            rows.append(row)
        w, h, c, decoded = decode_png(encode_png(width, height, channels, rows))
        if (w, h, c) != (width, height, channels) or decoded != rows:
            print("FAIL: PNG round trip with %d channels" % channels, file=sys.stderr)
            return 1
    print("PNG decoder self-test OK (RGB and RGBA, filter types 0-4)")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("screenshot", nargs="?")
    parser.add_argument("--header", help="path to include/kiln/profiler/report_html.hpp")
    parser.add_argument("--phases", type=int, default=5, help="phases in the rendered report")
    parser.add_argument("--min-phase-pixels", type=int, default=400)
    parser.add_argument("--min-memory-pixels", type=int, default=2000)
    parser.add_argument("--min-line-pixels", type=int, default=100)
    parser.add_argument("--min-colours", type=int, default=64)
    parser.add_argument("--tolerance", type=int, default=3, help="per channel, 0-255")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    if not args.screenshot or not args.header:
        parser.error("a screenshot and --header are required")
    try:
        return check(args)
    except (OSError, png_error, zlib.error) as e:
        print("FAIL: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
