#!/usr/bin/python3
"""Render the glyph image set: an ImageFolder of 32x32 grey PNGs of the 62
characters 0-9, A-Z, a-z, drawn with every font file Debian's font packages
installed here that has those characters (fonts-dejavu-core,
fonts-liberation, fonts-freefont-ttf, fonts-urw-base35, fonts-noto-core,
...).  One class per character.

    make-glyphs.py OUTDIR [--fonts DIR ...] [--renders N] [--size S] [--seed N]

writes OUTDIR/train/<class>/<font>-<k>.png and OUTDIR/val/<class>/...,
and OUTDIR/fonts.txt (which font went where).  The validation split holds
out whole font families (DejaVuSans with all its bold and oblique faces,
...): a model is scored on letter shapes it has never seen, not on
renderings of fonts it trained on.  Each (font, character) is rendered
--renders times at a size and offset drawn from --seed, white on black
(the zero padding of a random crop is then background).

Needs python3-pil (Pillow from Debian).  The same fonts and seed give the
same files.
"""
import argparse
import hashlib
import os
import random
import sys

from PIL import Image, ImageChops, ImageDraw, ImageFont

CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def class_name(c):
    return ("digit-" if c.isdigit() else "upper-" if c.isupper() else "lower-") + c


def family(path):
    """DejaVuSans-Bold.ttf -> DejaVuSans; NimbusSans-Italic.otf -> NimbusSans."""
    base = os.path.basename(path).rsplit(".", 1)[0]
    return base.split("-")[0].split("_")[0]


def draw(font, c, size):
    img = Image.new("L", (size * 2, size * 2), 0)
    ImageDraw.Draw(img).text((size // 2, size // 2), c, fill=255, font=font)
    return img


# symbol fonts that map letters to pictures (URW's Zapf Dingbats clone)
NOT_LETTERS = {"D050000L", "StandardSymbolsPS"}


def has_latin(path):
    """False for fonts without the 62 characters (symbol fonts, other
    scripts): their glyphs are the .notdef box, the same for every
    character."""
    if family(path) in NOT_LETTERS:
        return False
    try:
        font = ImageFont.truetype(path, 24)
    except OSError:
        return False
    tofu = draw(font, "\ue000", 32)  # a private-use character: .notdef
    seen = set()
    for c in CHARS:
        img = draw(font, c, 32)
        if img.getbbox() is None or ImageChops.difference(img, tofu).getbbox() is None:
            return False
        seen.add(img.tobytes())
    return len(seen) >= len(CHARS) - 2  # distinct shapes (a few fonts share l/I)


def render(path, c, size, rng):
    px = rng.randint(int(size * 0.6), int(size * 0.85))
    font = ImageFont.truetype(path, px)
    big = draw(font, c, size * 2)
    box = big.getbbox()
    glyph = big.crop(box)
    w, h = glyph.size
    if w > size - 2 or h > size - 2:  # wide glyphs (W, m) of wide fonts: scale down
        k = (size - 2) / max(w, h)
        glyph = glyph.resize((max(1, int(w * k)), max(1, int(h * k))), Image.LANCZOS)
        w, h = glyph.size
    out = Image.new("L", (size, size), 0)
    x = (size - w) // 2 + rng.randint(-2, 2)
    y = (size - h) // 2 + rng.randint(-2, 2)
    x = min(max(x, 0), size - w)
    y = min(max(y, 0), size - h)
    out.paste(glyph, (x, y))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--fonts", nargs="*", default=["/usr/share/fonts"])
    ap.add_argument("--renders", type=int, default=4)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--val-families", type=float, default=0.2,
                    help="share of font families held out for validation")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    paths = []
    for root in a.fonts:
        for d, _, files in os.walk(root):
            paths += [os.path.join(d, f) for f in files if f.lower().endswith((".ttf", ".otf"))]
    paths.sort()
    fonts = [p for p in paths if has_latin(p)]
    if not fonts:
        sys.exit("make-glyphs: no font with the characters 0-9, A-Z, a-z under %s; install "
                 "fonts-dejavu-core fonts-liberation fonts-freefont-ttf" % " ".join(a.fonts))
    families = sorted({family(p) for p in fonts})
    # the held-out families by a hash of their name: adding a font package
    # does not move the others
    def held_out(f):
        h = int(hashlib.sha256(("%d:%s" % (a.seed, f)).encode()).hexdigest()[:8], 16)
        return h / 2**32 < a.val_families
    val = {f for f in families if held_out(f)}
    if not val or val == set(families):  # too few families for the share: hold out one
        val = {families[len(families) // 2]}

    for split in ("train", "val"):
        for c in CHARS:
            os.makedirs(os.path.join(a.out, split, class_name(c)), exist_ok=True)
    counts = {"train": 0, "val": 0}
    with open(os.path.join(a.out, "fonts.txt"), "w") as listing:
        for p in fonts:
            split = "val" if family(p) in val else "train"
            listing.write("%s\t%s\n" % (split, p))
            name = os.path.basename(p).rsplit(".", 1)[0]
            rng = random.Random("%d:%s" % (a.seed, name))
            for c in CHARS:
                for k in range(a.renders):
                    img = render(p, c, a.size, rng)
                    img.save(os.path.join(a.out, split, class_name(c), "%s-%d.png" % (name, k)))
                    counts[split] += 1
    print("make-glyphs: %d fonts (%d families, %d held out for validation): %d training and "
          "%d validation images of %dx%d in %s" % (len(fonts), len(families), len(val),
          counts["train"], counts["val"], a.size, a.size, a.out))


if __name__ == "__main__":
    main()
