-- trainrun.nn: builds a static graph from the ops the kernels provide.
--
-- A model builder receives (nn, spec, batch) and returns g:finish{...}.
-- Tensors are handles {id, shape, dtype}.  The ops, their inputs and their
-- attributes are those of the op table (kernels/ops.h), and so is every
-- output shape and every check of a node: node() below asks the table
-- (require "trainrun.ops", core/config/recipe_ops.h) as each node is added,
-- so a mistake is reported at the recipe's line that made it, in the words
-- the core's graph check would use.  This file computes no op's shape
-- itself; tests/test_ops runs every builder here against the table.
local nn = {}
local ops = require "trainrun.ops"

local Graph = {}
Graph.__index = Graph

function nn.graph(batch)
  assert(type(batch) == "number" and batch >= 1, "nn.graph(batch): batch must be a positive number")
  return setmetatable({ batch = batch, tensors = {}, nodes = {}, inputs = {}, names = {}, count = {} }, Graph)
end

local function shape_str(s) return "[" .. table.concat(s, ",") .. "]" end

local function copy(s)
  local r = {}
  for i, v in ipairs(s) do r[i] = v end
  return r
end

local function new_tensor(g, name, role, shape, dtype, extra)
  if g.names[name] then error("tensor name '" .. name .. "' is used twice", 3) end
  for i, d in ipairs(shape) do
    if type(d) ~= "number" or d < 1 or d ~= math.floor(d) then
      error(("tensor '%s': dimension %d of %s is not a positive integer"):format(name, i, shape_str(shape)), 3)
    end
  end
  local t = { id = #g.tensors + 1, name = name, role = role, shape = copy(shape), dtype = dtype or "f32" }
  for k, v in pairs(extra or {}) do t[k] = v end
  g.tensors[t.id] = t
  g.names[name] = t
  return t
end

-- a unique name for an op's output: "<hint>" or "<op>.<n>"
local function out_name(g, op, hint)
  if hint and not g.names[hint] then return hint end
  g.count[op] = (g.count[op] or 0) + 1
  return (hint or op) .. "." .. g.count[op]
end

-- The one way a node is added: the op table checks it (the number and kinds
-- of its inputs, its attributes, its shape rule) and gives its output's
-- shape.  attrs are the node's attributes as the table names them; a tensor
-- among them (batchnorm's buffer) is a handle here and an id in the node.
-- Errors name the builder (`label`, the op's name unless the builder has
-- another) and are raised at this file's line, which the recipe loader's
-- handler (host.locate) turns into the line of the recipe code that called
-- the builder, tail calls or not.
local function node(g, op, inputs, attrs, hint, label)
  label = label or op
  for i, t in ipairs(inputs) do
    if type(t) ~= "table" or g.tensors[t.id] ~= t then
      error(("%s: input %d is not a tensor of this graph"):format(label, i))
    end
  end
  attrs = attrs or {}
  for k, v in pairs(attrs) do
    if type(v) == "table" and v.id ~= nil and g.tensors[v.id] ~= v then
      error(("%s: %s is not a tensor of this graph"):format(label, k))
    end
  end
  local shape, why = ops.shape(op, inputs, attrs)
  if not shape then error(label .. ": " .. why) end
  local name = out_name(g, op, hint)
  local out = new_tensor(g, name, "activation", shape, "f32")
  local n = { op = op, name = name, output = out.id, inputs = {}, segment = g.segment }
  for i, t in ipairs(inputs) do n.inputs[i] = t.id end
  for k, v in pairs(attrs) do
    if type(v) == "table" and v.id ~= nil then -- a tensor attribute: its id, and who holds it
      n[k] = v.id
      v.attribute_of = v.attribute_of or { op = op, name = name }
    else
      n[k] = v
    end
  end
  g.nodes[#g.nodes + 1] = n
  return out
end

-- Activation recomputation: the ops that build(...) adds form one segment
-- whose internal activations are not kept after forward; backward rebuilds
-- them.  Memory falls to one segment's worth; gradients are unchanged.
function Graph:recompute(build, ...)
  if self.segment then error("recompute segments do not nest", 2) end
  self.segments = (self.segments or 0) + 1
  self.segment = self.segments
  local out = build(...)
  self.segment = nil
  return out
end

function Graph:input(name, shape, dtype)
  local t = new_tensor(self, name, "input", shape, dtype or "f32")
  self.inputs[#self.inputs + 1] = t.id
  return t
end

-- opts: init = "normal" | "zeros" | "ones", std, decay (default: 2-D and up)
function Graph:param(name, shape, opts)
  opts = opts or {}
  local decay = opts.decay
  if decay == nil then decay = #shape >= 2 end
  return new_tensor(self, name, "param", shape, "f32",
    { init = opts.init or "normal", std = opts.std or 0.02, decay = decay })
end

local function last(s) return s[#s] end

-- Attributes a builder leaves out (nil) take the op table's defaults, which
-- the core fills in (tr_attrs, the shape rules): eps 1e-5, theta 10000,
-- kv_heads = heads, ignore_index -1, stride 1 (pooling: the window), ...

function Graph:embedding(tbl, idx, name) return node(self, "embedding", { tbl, idx }, nil, name) end
function Graph:add_rows(x, p, name) return node(self, "add_rows", { x, p }, nil, name) end
function Graph:add(a, b, name) return node(self, "add", { a, b }, nil, name) end

-- y = x @ w^T + b, w: [out, in]; b a bias [out], or an addend of y's shape
-- (the product goes onto it: a residual or an adapter's update in one pass)
function Graph:linear(x, w, b, name)
  return node(self, "linear", b and { x, w, b } or { x, w }, nil, name)
end

function Graph:matmul(a, b, trans_b, name)
  return node(self, "matmul", { a, b }, { trans_b = trans_b and 1 or 0 }, name)
end

function Graph:layernorm(x, w, b, eps, name)
  return node(self, "layernorm", { x, w, b }, { eps = eps }, name)
end

function Graph:gelu(x, name) return node(self, "gelu", { x }, nil, name) end
function Graph:relu(x, name) return node(self, "relu", { x }, nil, name) end

function Graph:attention(qkv, heads, name)
  return node(self, "attention", { qkv }, { heads = heads }, name)
end

-- Grouped-query attention: q [B,T,heads*D], k and v [B,T,kv_heads*D];
-- query head h reads key/value head floor(h / (heads / kv_heads)).
-- kv_heads = heads (the default) is multi-head attention, kv_heads = 1
-- multi-query.  Causal, scale 1/sqrt(D); the output is [B,T,heads*D].
function Graph:gqa_attention(q, k, v, heads, kv_heads, name)
  return node(self, "attention", { q, k, v }, { heads = heads, kv_heads = kv_heads }, name, "gqa_attention")
end

-- y = x / sqrt(mean(x^2) + eps) * w over the last dimension (RMSNorm)
function Graph:rmsnorm(x, w, eps, name)
  return node(self, "rmsnorm", { x, w }, { eps = eps }, name)
end

-- Rotary position embedding (Hugging Face's rotate-half pairing (i, i+D/2)):
-- x [B,T,heads*D], D even; position t turns pair i by t * theta^(-2i/D)
-- (theta 10000 unless given).  scaling (optional): Llama 3.1's frequency
-- scaling, { factor = 8, low_freq_factor = 1, high_freq_factor = 4,
-- original_ctx = 8192 } (transformers' rope_type "llama3").
function Graph:rope(x, heads, theta, name, scaling)
  local attrs = { heads = heads, theta = theta }
  if scaling ~= nil then
    if type(scaling) ~= "table" then
      error(("rope: scaling must be a table { factor, low_freq_factor, high_freq_factor, "
             .. "original_ctx }, got %s"):format(type(scaling)))
    end
    attrs.rope_factor = scaling.factor
    attrs.rope_low_freq_factor = scaling.low_freq_factor
    attrs.rope_high_freq_factor = scaling.high_freq_factor
    attrs.rope_original_ctx = scaling.original_ctx
  end
  return node(self, "rope", { x }, attrs, name)
end

-- silu(gate) * up: the SiLU-gated half of a SwiGLU MLP
function Graph:swiglu(gate, up, name) return node(self, "swiglu", { gate, up }, nil, name) end

-- Dropout: in training each element is zeroed with probability p and the
-- rest scaled by 1 / (1 - p); evaluation passes x through
function Graph:dropout(x, p, name)
  -- p is required here (the table's default, 0.5, would hide a forgotten
  -- one); its range is the table's
  if p == nil then error("dropout: the probability is required: g:dropout(x, p)") end
  return node(self, "dropout", { x }, { p = p }, name)
end

-- s * x, s a constant (embedding scaling)
function Graph:scale(x, s, name)
  -- the factor is this builder's required argument; the table's default
  -- (1, for a node table without one) would hide a forgotten one
  if s == nil then error("scale: the factor is required: g:scale(x, s)") end
  return node(self, "scale", { x }, { scale = s }, name)
end

-- ---- Convolutional ops.  Images are channel-last, x [B,H,W,C] (the layout
-- oneDNN's and cuDNN's fastest convolutions take); conv weights are
-- [OC,KH,KW,IC/groups].  Spatial options are a number n (n x n) or a pair
-- {h, w}.  Per spatial dimension the output is
-- floor((in + 2 pad - dilation (k - 1) - 1) / stride) + 1.

-- y = conv(x, w) (+ b): x [B,H,W,IC], w [OC,KH,KW,IC/groups], b [OC].
-- opts: stride (1), pad (0), dilation (1), groups (1; IC for depthwise)
function Graph:conv2d(x, w, b, opts, name)
  opts = opts or {}
  return node(self, "conv2d", b and { x, w, b } or { x, w },
              { stride = opts.stride, pad = opts.pad, dilation = opts.dilation, groups = opts.groups }, name)
end

-- max over each kernel window (padding never wins); opts: stride (the window), pad (0)
function Graph:maxpool(x, kernel, opts, name)
  opts = opts or {}
  return node(self, "maxpool", { x }, { kernel = kernel, stride = opts.stride, pad = opts.pad }, name)
end
-- mean over each kernel window, padding counted as zeros; opts as maxpool
function Graph:avgpool(x, kernel, opts, name)
  opts = opts or {}
  return node(self, "avgpool", { x }, { kernel = kernel, stride = opts.stride, pad = opts.pad }, name)
end

-- x [B,H,W,C] -> [B,C], the mean over H and W
function Graph:global_avgpool(x, name) return node(self, "global_avgpool", { x }, nil, name) end

-- A buffer: state a node updates in training and reads in eval (batch
-- norm's running statistics), fp32, never trained, saved in checkpoints
-- beside the parameters.
function Graph:buffer(name, shape)
  return new_tensor(self, name, "buffer", shape, "f32")
end

-- Batch normalisation over every dimension but the last (channels):
-- x [...,C], w [C], b [C], running [2,C] (a buffer: running mean, then
-- running unbiased variance).  Training normalises with the batch's
-- statistics and moves running by momentum; eval uses running.
function Graph:batchnorm(x, w, b, running, opts, name)
  opts = opts or {}
  return node(self, "batchnorm", { x, w, b },
              { eps = opts.eps, momentum = opts.momentum, buffer = running }, name)
end

function Graph:cross_entropy(logits, targets, ignore_index, name)
  return node(self, "cross_entropy", { logits, targets }, { ignore_index = ignore_index }, name or "loss")
end

-- Layers: parameters named like the usual checkpoint layouts.
function Graph:Linear(prefix, x, out_features, opts)
  opts = opts or {}
  local w = self:param(prefix .. ".weight", { out_features, last(x.shape) }, { std = opts.std })
  local b = opts.bias ~= false and self:param(prefix .. ".bias", { out_features }, { init = "zeros" }) or nil
  return self:linear(x, w, b, prefix)
end

function Graph:LayerNorm(prefix, x, eps)
  local C = last(x.shape)
  local w = self:param(prefix .. ".weight", { C }, { init = "ones" })
  local b = self:param(prefix .. ".bias", { C }, { init = "zeros" })
  return self:layernorm(x, w, b, eps, prefix)
end

-- RMSNorm with a learned weight (ones, no weight decay), named prefix.weight
function Graph:RMSNorm(prefix, x, eps)
  local w = self:param(prefix .. ".weight", { last(x.shape) }, { init = "ones", decay = false })
  return self:rmsnorm(x, w, eps, prefix)
end

-- The two checks of this file that are not the op table's: Conv2d makes
-- its weight [OC,KH,KW,IC/groups] from the image's channels and the kernel
-- before any conv2d node exists to ask about, so it checks those two itself.
local function image(layer, x)
  if type(x) ~= "table" or type(x.shape) ~= "table" or #x.shape ~= 4 then
    error(("%s: the input must be an image batch [B,H,W,C] (channel-last), got %s"):format(
      layer, type(x) == "table" and type(x.shape) == "table" and shape_str(x.shape) or tostring(x)))
  end
end

local function kernel_pair(layer, v)
  local p = type(v) == "number" and { v, v } or v
  local ok = type(p) == "table" and #p == 2
  for i = 1, 2 do
    local d = ok and p[i]
    ok = ok and type(d) == "number" and d == math.floor(d) and d >= 1 and d <= 65536
  end
  if not ok then
    error(("%s: kernel must be a whole number from 1 to 65536 or a pair {h, w} of them, got %s"):format(
      layer, type(v) == "table" and #v == 2 and ("{%s, %s}"):format(tostring(v[1]), tostring(v[2])) or tostring(v)))
  end
  return { p[1], p[2] }
end

-- A convolution layer named prefix.weight [OC,KH,KW,IC/groups] (He init,
-- std sqrt(2 / fan_in)) and prefix.bias unless opts.bias == false.
-- kernel: a number or {KH, KW}; opts as conv2d, plus std.
function Graph:Conv2d(prefix, x, out_channels, kernel, opts)
  opts = opts or {}
  image("Conv2d", x)
  local k = kernel_pair("Conv2d", kernel)
  local groups = opts.groups or 1
  local fan_in = k[1] * k[2] * x.shape[4] / groups
  local w = self:param(prefix .. ".weight", { out_channels, k[1], k[2], x.shape[4] / groups },
                       { std = opts.std or math.sqrt(2 / fan_in) })
  local b = opts.bias ~= false and self:param(prefix .. ".bias", { out_channels }, { init = "zeros" }) or nil
  return self:conv2d(x, w, b, opts, prefix)
end

-- Batch norm with a learned scale (ones, or zeros with opts.zero_init)
-- and shift (zeros), neither weight-decayed, and running statistics in
-- the buffer prefix.running [2,C].  opts: momentum, eps, zero_init.
function Graph:BatchNorm(prefix, x, opts)
  opts = opts or {}
  local C = last(x.shape)
  local w = self:param(prefix .. ".weight", { C }, { init = opts.zero_init and "zeros" or "ones", decay = false })
  local b = self:param(prefix .. ".bias", { C }, { init = "zeros", decay = false })
  return self:batchnorm(x, w, b, self:buffer(prefix .. ".running", { 2, C }), opts, prefix)
end

-- The graph as plain tables for the core.  loss is required; logits lets
-- `trainrun sample` read predictions.
function Graph:finish(outputs)
  if not outputs or not outputs.loss then error("finish{loss = ...}: a model must end in a loss", 2) end
  return { batch = self.batch, tensors = self.tensors, nodes = self.nodes, inputs = self.inputs,
           loss = outputs.loss.id, logits = outputs.logits and outputs.logits.id or nil }
end

return nn
