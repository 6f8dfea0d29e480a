-- A ResNet-18 (torchvision's layout, the CIFAR-style 3x3 stem) on the glyph
-- set: 62 classes (0-9, A-Z, a-z) rendered at 32x32 from the fonts Debian
-- ships, validated on font families it never trains on.  Make the data
-- once, in the build directory:
--
--   apt-get install python3-pil fonts-dejavu-core fonts-liberation fonts-freefont-ttf \
--       fonts-urw-base35 fonts-noto-core fonts-crosextra-carlito fonts-crosextra-caladea
--   make data/glyphs          # contrib/data/make-glyphs.py
--   trainrun prepare data/glyphs/train --val data/glyphs/val --size 32 \
--       --channels 1 -o data/glyphs-32
--   trainrun ../recipes/resnet-glyphs.lua
--
-- The loader pads each training image by 4 pixels and crops it back at a
-- random place (RandomCrop(32, padding=4)); no flip: letters are not
-- mirror-symmetric.  docs/results.md records what it reaches.
return {
  model = resnet { depth = 18, width = 16, classes = 62, input = { 32, 32, 1 }, stem = "small" },
  data = { plugin = "images", dir = "data/glyphs-32", pad = 4, views = 8 },
  optimizer = { type = "adamw", lr = 2e-3, weight_decay = 0.05 },
  schedule = { plugin = "cosine", warmup = 100 },
  train = { epochs = 6, batch = 128, eval_every = 330, eval_batches = 50, log_every = 50 },
}
