-- A byte-level GPT on the King James Bible.
--   make data/kjv.txt          (needs Debian's bible-kjv: bible -f "Gen1:1-Rev22:21")
--   trainrun recipes/kjv-char.lua
--   trainrun sample runs/kjv-char --prompt "In the beginning"
return {
  extends = "base/gpt-char.lua",
  data = { plugin = "text", path = "data/kjv.txt", val_fraction = 0.05 },
}
