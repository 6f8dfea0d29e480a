-- trainrun.models: the model constructors a recipe sees as globals.
--
--   model = gpt { vocab = 256, ctx = 128, layers = 4, heads = 4, dim = 128 }
--   model = llama { vocab = 256, ctx = 256, layers = 4, heads = 8, kv_heads = 2,
--                   dim = 256, ffn_dim = 688 }
--   model = mlp { inputs = 64, hidden = { 128 }, classes = 10 }
--   model = cnn { input = { 8, 8, 1 }, channels = { 32, 64 }, classes = 10 }
--   model = resnet { depth = 18, width = 64, classes = 1000, input = { 224, 224, 3 } }
--   model = { build = function(nn, spec, batch) ... end, width = 32 }  -- inline
--
-- A constructor only records the options (so command-line overrides such as
-- model.layers=8 still apply); the graph is built later, per micro-batch.
local nn = require "trainrun.nn"

local M = { nn = nn }
local builders = {}

local function check(spec, what, schema)
  for key, rule in pairs(schema) do
    local v = spec[key]
    if v == nil and rule.default ~= nil then spec[key] = rule.default; v = rule.default end
    if v == nil then error(("%s: option '%s' is required (%s)"):format(what, key, rule.help), 0) end
    if rule.int and (type(v) ~= "number" or v ~= math.floor(v) or v < (rule.min or -math.huge)
                     or v > (rule.max or 2^53)) then
      error(("%s: option '%s' must be an integer between %d and %d, got %s"):format(
        what, key, rule.min or 0, rule.max or 2^53, tostring(v)), 0)
    end
    -- num: a finite number above `above` (or from `min`) up to `max`
    if rule.num then
      local lo, hi = rule.above or rule.min or -1e30, rule.max or 1e30
      if type(v) ~= "number" or v ~= v or v > hi or v < lo or (rule.above and v == lo) then
        error(("%s: option '%s' must be a number %s %g and at most %g, got %s"):format(what, key,
          rule.above and "above" or "from", lo, hi, tostring(v)), 0)
      end
    end
    if rule.bool and type(v) ~= "boolean" then
      error(("%s: option '%s' must be true or false, got %s"):format(what, key, tostring(v)), 0)
    end
  end
  for key in pairs(spec) do
    if key ~= "type" and key ~= "build" and not schema[key] then
      local names = {}
      for k in pairs(schema) do names[#names + 1] = k end
      table.sort(names)
      error(("%s: unknown option '%s'; options: %s"):format(what, key, table.concat(names, ", ")), 0)
    end
  end
end

-- Upper bounds: token ids are int32; the rest far past any trained model,
-- and well inside the sizes the core's kernels index with int.
local gpt_schema = {
  vocab  = { int = true, min = 2, max = 2147483647, help = "vocabulary size (256 for bytes)" },
  ctx    = { int = true, min = 1, max = 1048576, help = "context length in tokens" },
  layers = { int = true, min = 1, max = 1024, help = "transformer blocks" },
  heads  = { int = true, min = 1, max = 65536, help = "attention heads per block" },
  dim    = { int = true, min = 1, max = 1048576, help = "model width" },
  recompute = { int = true, min = 0, max = 1024, default = 0,
                help = "recompute the activations of every k-th block in backward (0: none)" },
}

-- x through the model's o.layers blocks, block(l, x) for l = 0, 1, ...;
-- with recompute = k > 0 every k-th block keeps only its input and is
-- recomputed in backward (the gpt and llama builders share it).
local function blocks(g, o, block, x)
  for l = 0, o.layers - 1 do
    if o.recompute > 0 and l % o.recompute == 0 then
      x = g:recompute(block, l, x)
    else
      x = block(l, x)
    end
  end
  return x
end

-- GPT-2: learned positions, pre-norm blocks, GELU MLP of 4x width, tied
-- embedding and output head; init std 0.02, residual projections scaled
-- by 1/sqrt(2 * layers).
function builders.gpt(nn, o, B)
  check(o, "gpt", gpt_schema)
  if o.dim % o.heads ~= 0 then
    error(("gpt: heads (%d) must divide dim (%d)"):format(o.heads, o.dim), 0)
  end
  local V, T, L, H, C = o.vocab, o.ctx, o.layers, o.heads, o.dim
  local g = nn.graph(B)
  local tokens = g:input("tokens", { B, T }, "i32")
  local targets = g:input("targets", { B, T }, "i32")
  local proj_std = 0.02 / math.sqrt(2 * L)
  local wte = g:param("transformer.wte.weight", { V, C })
  local wpe = g:param("transformer.wpe.weight", { T, C })
  local x = g:add_rows(g:embedding(wte, tokens, "embed"), wpe, "embed_pos")
  local function block(l, x)
    local p = "transformer.h." .. l
    local h = g:LayerNorm(p .. ".ln_1", x)
    h = g:attention(g:Linear(p .. ".attn.c_attn", h, 3 * C), H, p .. ".attn")
    x = g:add(x, g:Linear(p .. ".attn.c_proj", h, C, { std = proj_std }), p .. ".res_1")
    h = g:LayerNorm(p .. ".ln_2", x)
    h = g:gelu(g:Linear(p .. ".mlp.c_fc", h, 4 * C), p .. ".mlp.gelu")
    return g:add(x, g:Linear(p .. ".mlp.c_proj", h, C, { std = proj_std }), p .. ".res_2")
  end
  x = blocks(g, o, block, x)
  x = g:LayerNorm("transformer.ln_f", x)
  local logits = g:linear(x, wte, nil, "lm_head")
  return g:finish { loss = g:cross_entropy(logits, targets), logits = logits }
end

local llama_schema = {
  vocab    = gpt_schema.vocab,
  ctx      = gpt_schema.ctx,
  layers   = gpt_schema.layers,
  heads    = gpt_schema.heads,
  dim      = gpt_schema.dim,
  kv_heads = { int = true, min = 1, max = 65536,
               help = "key/value heads, dividing heads (grouped-query attention; default heads)" },
  ffn_dim  = { int = true, min = 1, max = 16777216, help = "hidden width of the SwiGLU MLP" },
  rope_theta = { num = true, above = 0, max = 1e12, default = 10000, help = "base of the rotary frequencies" },
  norm_eps = { num = true, above = 0, max = 0.5, default = 1e-5, help = "RMSNorm epsilon" },
  -- Llama 3.1's rope_scaling (transformers' rope_type "llama3"); rope_factor 0: none
  rope_factor = { num = true, min = 0, max = 1e6, default = 0,
                  help = "Llama 3.1 rope scaling: the factor low frequencies are divided by (0: no scaling)" },
  rope_low_freq_factor = { num = true, min = 0, max = 1e6, default = 0,
                           help = "Llama 3.1 rope scaling: low_freq_factor (1 in Llama 3.1)" },
  rope_high_freq_factor = { num = true, min = 0, max = 1e6, default = 0,
                            help = "Llama 3.1 rope scaling: high_freq_factor (4 in Llama 3.1)" },
  rope_original_ctx = { int = true, min = 0, max = 16777216, default = 0,
                        help = "Llama 3.1 rope scaling: original_max_position_embeddings (8192 in Llama 3.1)" },
  tie_embeddings = { bool = true, default = false,
                     help = "the output head reuses model.embed_tokens.weight (no lm_head.weight)" },
  qkv_bias = { bool = true, default = false, help = "biases on the q, k, v projections (Qwen2)" },
  embed_scale = { num = true, default = 1,
                  help = "factor the token embeddings are multiplied by (1: none)" },
  init_std = { num = true, min = 0, max = 1e6, default = 0.02,
               help = "standard deviation of the normal init of every weight matrix" },
  recompute = gpt_schema.recompute,
}

-- Llama (also Mistral, Qwen2 with qkv_bias, ...): token embedding, pre-norm
-- blocks x += o_proj(attn(rope(q), rope(k), v)); x += down(silu(gate) * up),
-- RMSNorm everywhere, no biases, a final RMSNorm and an lm_head (or the
-- embedding reused when tie_embeddings).  Parameters carry Hugging Face's
-- names, so checkpoints map one to one; init as Hugging Face's: every
-- weight matrix normal(init_std), norms ones.
function builders.llama(nn, o, B)
  if o.kv_heads == nil then o.kv_heads = o.heads end
  check(o, "llama", llama_schema)
  if o.dim % o.heads ~= 0 then
    error(("llama: heads (%d) must divide dim (%d)"):format(o.heads, o.dim), 0)
  end
  if o.heads % o.kv_heads ~= 0 then
    error(("llama: kv_heads (%d) must divide heads (%d)"):format(o.kv_heads, o.heads), 0)
  end
  if (o.dim / o.heads) % 2 ~= 0 then
    error(("llama: the head dim dim/heads = %d must be even for rotary embeddings"):format(o.dim / o.heads), 0)
  end
  local V, T, H, KV, C, F = o.vocab, o.ctx, o.heads, o.kv_heads, o.dim, o.ffn_dim
  local D, std, eps, theta = C / H, o.init_std, o.norm_eps, o.rope_theta
  local scaling -- nil: plain rope; the node checks the values together
  if o.rope_factor ~= 0 or o.rope_low_freq_factor ~= 0 or o.rope_high_freq_factor ~= 0
     or o.rope_original_ctx ~= 0 then
    scaling = { factor = o.rope_factor, low_freq_factor = o.rope_low_freq_factor,
                high_freq_factor = o.rope_high_freq_factor, original_ctx = o.rope_original_ctx }
  end
  local g = nn.graph(B)
  local tokens = g:input("tokens", { B, T }, "i32")
  local targets = g:input("targets", { B, T }, "i32")
  local embed = g:param("model.embed_tokens.weight", { V, C }, { std = std })
  local x = g:embedding(embed, tokens, "embed")
  if o.embed_scale ~= 1 then x = g:scale(x, o.embed_scale, "embed_scale") end
  local function proj(name, h, width, bias)
    return g:Linear(name, h, width, { std = std, bias = bias or false })
  end
  local function block(l, x)
    local p = "model.layers." .. l
    local h = g:RMSNorm(p .. ".input_layernorm", x, eps)
    local q = proj(p .. ".self_attn.q_proj", h, H * D, o.qkv_bias)
    local k = proj(p .. ".self_attn.k_proj", h, KV * D, o.qkv_bias)
    local v = proj(p .. ".self_attn.v_proj", h, KV * D, o.qkv_bias)
    q = g:rope(q, H, theta, p .. ".self_attn.q_rope", scaling)
    k = g:rope(k, KV, theta, p .. ".self_attn.k_rope", scaling)
    h = g:gqa_attention(q, k, v, H, KV, p .. ".self_attn")
    x = g:add(x, proj(p .. ".self_attn.o_proj", h, C), p .. ".res_1")
    h = g:RMSNorm(p .. ".post_attention_layernorm", x, eps)
    h = g:swiglu(proj(p .. ".mlp.gate_proj", h, F), proj(p .. ".mlp.up_proj", h, F), p .. ".mlp.act")
    return g:add(x, proj(p .. ".mlp.down_proj", h, C), p .. ".res_2")
  end
  x = blocks(g, o, block, x)
  x = g:RMSNorm("model.norm", x, eps)
  local logits
  if o.tie_embeddings then
    logits = g:linear(x, embed, nil, "lm_head")
  else
    logits = proj("lm_head", x, V)
  end
  return g:finish { loss = g:cross_entropy(logits, targets), logits = logits }
end

local mlp_schema = {
  inputs     = { int = true, min = 1, max = 1048576, help = "input features" },
  hidden     = { default = {}, help = "widths of the hidden layers, e.g. { 128, 64 }" },
  classes    = { int = true, min = 2, max = 2147483647, help = "output classes" },
  activation = { default = "relu", help = "relu or gelu" },
}

function builders.mlp(nn, o, B)
  check(o, "mlp", mlp_schema)
  if o.activation ~= "relu" and o.activation ~= "gelu" then
    error(("mlp: activation must be \"relu\" or \"gelu\", got %q"):format(tostring(o.activation)), 0)
  end
  local g = nn.graph(B)
  local x = g:input("features", { B, o.inputs }, "f32")
  local targets = g:input("targets", { B }, "i32")
  local width = o.inputs
  for i, h in ipairs(o.hidden) do
    -- He initialisation for ReLU-family layers
    x = g:Linear("layers." .. (i - 1), x, h, { std = math.sqrt(2 / width) })
    x = o.activation == "gelu" and g:gelu(x) or g:relu(x)
    width = h
  end
  local logits = g:Linear("head", x, o.classes, { std = math.sqrt(1 / width) })
  return g:finish { loss = g:cross_entropy(logits, targets), logits = logits }
end

-- ---- Convolutional models.  Images are channel-last x [B,H,W,C]
-- (input = { H, W, C }); a data source giving H*W*C features per sample
-- (the csv plugin's 64 for the 8x8 digits) fills it row by row.

-- o.input as { H, W, C }, whole numbers, or an error naming the builder
local function image_input(what, v)
  if type(v) ~= "table" or #v ~= 3 then
    error(("%s: option 'input' must be { H, W, C } (height, width, channels), got %s"):format(
      what, tostring(v)), 0)
  end
  for i = 1, 3 do
    local d = v[i]
    if type(d) ~= "number" or d ~= math.floor(d) or d < 1 or d > 65536 then
      error(("%s: option 'input' must be { H, W, C } of whole numbers from 1 to 65536, got %s at %d"):format(
        what, tostring(d), i), 0)
    end
  end
  return v[1], v[2], v[3]
end

-- a list of whole numbers from 1 to max, or an error naming the option
local function widths(what, key, v, max)
  if type(v) ~= "table" then
    error(("%s: option '%s' must be a list of widths such as { 32, 64 }, got %s"):format(what, key, tostring(v)), 0)
  end
  for i, d in ipairs(v) do
    if type(d) ~= "number" or d ~= math.floor(d) or d < 1 or d > max then
      error(("%s: option '%s': width %d is %s; widths are whole numbers from 1 to %d"):format(
        what, key, i, tostring(d), max), 0)
    end
  end
end

local cnn_schema = {
  input    = { help = "image size { H, W, C }, e.g. { 8, 8, 1 } (channel-last)" },
  channels = { default = { 32, 64 }, help = "width of each stage of convolutions, e.g. { 32, 64 }" },
  convs    = { int = true, min = 1, max = 64, default = 2, help = "convolutions per stage (kernel x kernel, same size)" },
  kernel   = { int = true, min = 1, max = 15, default = 3, help = "convolution window (odd: same size out)" },
  pool     = { default = "max", help = "\"max\", \"avg\" or \"none\": 2x2 pooling between stages" },
  batchnorm = { bool = true, default = true, help = "batch norm after each convolution (else a conv bias)" },
  hidden   = { default = {}, help = "widths of linear layers after the global average pool" },
  classes  = { int = true, min = 2, max = 2147483647, help = "output classes" },
  recompute = { int = true, min = 0, max = 1024, default = 0,
                help = "recompute the activations of every k-th stage in backward (0: none)" },
}

-- A plain CNN: stages of `convs` kernel x kernel convolutions (same
-- size, BN, ReLU), 2x2 pooling between stages, global average pooling,
-- optional hidden linear layers and a linear head.
function builders.cnn(nn, o, B)
  check(o, "cnn", cnn_schema)
  local H, W, C = image_input("cnn", o.input)
  widths("cnn", "channels", o.channels, 1048576)
  widths("cnn", "hidden", o.hidden, 1048576)
  if #o.channels == 0 then error("cnn: option 'channels' needs one stage at least, e.g. { 32 }", 0) end
  if o.pool ~= "max" and o.pool ~= "avg" and o.pool ~= "none" then
    error(("cnn: option 'pool' must be \"max\", \"avg\" or \"none\", got %s"):format(tostring(o.pool)), 0)
  end
  if o.kernel % 2 == 0 then error(("cnn: option 'kernel' must be odd (same-size convolutions), got %d"):format(o.kernel), 0) end
  local g = nn.graph(B)
  local x = g:input("images", { B, H, W, C }, "f32")
  local targets = g:input("targets", { B }, "i32")
  local pad = (o.kernel - 1) / 2
  local function stage(s, x)
    for c = 0, o.convs - 1 do
      local p = ("stages.%d.%d"):format(s, c)
      x = g:Conv2d(p .. ".conv", x, o.channels[s + 1], o.kernel, { pad = pad, bias = not o.batchnorm })
      if o.batchnorm then x = g:BatchNorm(p .. ".bn", x) end
      x = g:relu(x, p .. ".relu")
    end
    return x
  end
  for s = 0, #o.channels - 1 do
    if s > 0 and o.pool ~= "none" then
      local p = "stages." .. s .. ".pool"
      if x.shape[2] < 2 or x.shape[3] < 2 then
        error(("cnn: stage %d: the image is down to %dx%d, too small to pool; use fewer stages or pool = \"none\""):format(
          s + 1, x.shape[2], x.shape[3]), 0)
      end
      x = o.pool == "max" and g:maxpool(x, 2, nil, p) or g:avgpool(x, 2, nil, p)
    end
    if o.recompute > 0 and s % o.recompute == 0 then
      x = g:recompute(stage, s, x)
    else
      x = stage(s, x)
    end
  end
  x = g:global_avgpool(x, "pool")
  local width = o.channels[#o.channels]
  for i, h in ipairs(o.hidden) do
    x = g:relu(g:Linear("hidden." .. (i - 1), x, h, { std = math.sqrt(2 / width) }))
    width = h
  end
  local logits = g:Linear("head", x, o.classes, { std = math.sqrt(1 / width) })
  return g:finish { loss = g:cross_entropy(logits, targets), logits = logits }
end

local resnet_schema = {
  depth   = { int = true, min = 18, max = 50, default = 18, help = "18 or 34 (basic blocks), 50 (bottlenecks)" },
  width   = { int = true, min = 1, max = 65536, default = 64, help = "stem width; stages are 1, 2, 4, 8 times it" },
  classes = { int = true, min = 2, max = 2147483647, help = "output classes" },
  input   = { default = { 224, 224, 3 }, help = "image size { H, W, C } (channel-last)" },
  stem    = { default = "imagenet",
              help = "\"imagenet\": 7x7 stride-2 conv + 3x3 max pool; \"small\": one 3x3 conv (32x32 images)" },
  zero_init_residual = { bool = true, default = false,
                         help = "the last batch norm of each residual block starts at scale 0" },
  momentum = { num = true, above = 0, max = 1, default = 0.1, help = "batch norm momentum of the running statistics" },
  recompute = { int = true, min = 0, max = 1024, default = 0,
                help = "recompute the activations of every k-th residual block in backward (0: none)" },
}

local resnet_blocks = { [18] = { 2, 2, 2, 2 }, [34] = { 3, 4, 6, 3 }, [50] = { 3, 4, 6, 3 } }

-- ResNet (He et al. 2015) as torchvision builds it: stem, four stages of
-- residual blocks (the first block of stages 2-4 halves the image with
-- stride 2 in its 3x3 conv), global average pool, fc.  Parameters carry
-- torchvision's names (conv1.weight, layer1.0.bn1.weight, fc.bias, ...);
-- conv weights are channel-last [OC,KH,KW,IC], and each batch norm's
-- running mean and variance are one buffer NAME.running [2,C].
function builders.resnet(nn, o, B)
  check(o, "resnet", resnet_schema)
  local H, W, C = image_input("resnet", o.input)
  local counts = resnet_blocks[o.depth]
  if not counts then error(("resnet: option 'depth' must be 18, 34 or 50, got %d"):format(o.depth), 0) end
  if o.stem ~= "imagenet" and o.stem ~= "small" then
    error(("resnet: option 'stem' must be \"imagenet\" or \"small\", got %s"):format(tostring(o.stem)), 0)
  end
  local bottleneck, expansion = o.depth >= 50, o.depth >= 50 and 4 or 1
  local g = nn.graph(B)
  local x = g:input("images", { B, H, W, C }, "f32")
  local targets = g:input("targets", { B }, "i32")
  local bn = { momentum = o.momentum }
  local last_bn = { momentum = o.momentum, zero_init = o.zero_init_residual }
  local function conv_bn(p, x, width, k, stride, bn_name, opts)
    x = g:Conv2d(p .. ".conv" .. bn_name, x, width, k, { stride = stride, pad = (k - 1) / 2, bias = false })
    return g:BatchNorm(p .. ".bn" .. bn_name, x, opts)
  end
  if o.stem == "imagenet" then
    x = g:Conv2d("conv1", x, o.width, 7, { stride = 2, pad = 3, bias = false })
  else
    x = g:Conv2d("conv1", x, o.width, 3, { stride = 1, pad = 1, bias = false })
  end
  x = g:relu(g:BatchNorm("bn1", x, bn), "relu")
  if o.stem == "imagenet" then x = g:maxpool(x, 3, { stride = 2, pad = 1 }, "maxpool") end
  local function block(p, x, width, stride)
    local out_width, h = width * expansion
    if bottleneck then
      h = g:relu(conv_bn(p, x, width, 1, 1, "1", bn), p .. ".relu1")
      h = g:relu(conv_bn(p, h, width, 3, stride, "2", bn), p .. ".relu2")
      h = conv_bn(p, h, out_width, 1, 1, "3", last_bn)
    else
      h = g:relu(conv_bn(p, x, width, 3, stride, "1", bn), p .. ".relu1")
      h = conv_bn(p, h, out_width, 3, 1, "2", last_bn)
    end
    if stride ~= 1 or x.shape[4] ~= out_width then
      x = g:Conv2d(p .. ".downsample.0", x, out_width, 1, { stride = stride, bias = false })
      x = g:BatchNorm(p .. ".downsample.1", x, bn)
    end
    return g:relu(g:add(h, x, p .. ".add"), p .. ".relu")
  end
  local n = 0
  for s = 1, 4 do
    for b = 0, counts[s] - 1 do
      local stride = (s > 1 and b == 0) and 2 or 1
      local p, width = ("layer%d.%d"):format(s, b), o.width * 2 ^ (s - 1)
      if o.recompute > 0 and n % o.recompute == 0 then
        x = g:recompute(block, p, x, width, stride)
      else
        x = block(p, x, width, stride)
      end
      n = n + 1
    end
  end
  x = g:global_avgpool(x, "avgpool")
  local logits = g:Linear("fc", x, o.classes, { std = math.sqrt(1 / x.shape[2]) })
  return g:finish { loss = g:cross_entropy(logits, targets), logits = logits }
end

function M.gpt(o) o.type = "gpt"; return o end
function M.cnn(o) o.type = "cnn"; return o end
function M.resnet(o) o.type = "resnet"; return o end
function M.mlp(o) o.type = "mlp"; return o end
function M.llama(o) o.type = "llama"; return o end

-- Called by the core: the graph for one micro-batch of `batch` samples.
function M.build(spec, batch)
  if type(spec) ~= "table" then error("model must be a table, e.g. gpt { ... }", 0) end
  local builder = spec.build or builders[spec.type]
  if type(builder) ~= "function" then
    error(("model: unknown type %q (built in: gpt, llama, mlp, cnn, resnet; or give build = function(nn, spec, batch))"):format(
      tostring(spec.type)), 0)
  end
  -- builders fill defaults into spec; work on a copy so the recipe is untouched
  local copy = {}
  for k, v in pairs(spec) do copy[k] = v end
  return builder(nn, copy, batch)
end

-- the builders' option tables, for `trainrun help recipe` (read, never changed)
M.schemas = { gpt = gpt_schema, llama = llama_schema, mlp = mlp_schema, cnn = cnn_schema,
              resnet = resnet_schema }

return M
