-- trainrun.nn: builds a static graph from the ops the kernels provide.
--
-- A model builder receives (nn, spec, batch) and returns g:finish{...}.
-- Tensors are handles {id, shape, dtype}; shapes are checked here so that a
-- mistake is reported at the line of the builder that made it, and checked
-- again by the core before any memory is planned.  The ops, their inputs and
-- their attributes are those of the op table (kernels/ops.h); tests/test_ops
-- runs every builder here and checks what it emits against that table.
local nn = {}

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

local function node(g, op, inputs, shape, attrs, hint)
  for i, t in ipairs(inputs) do
    if type(t) ~= "table" or g.tensors[t.id] ~= t then
      error(("%s: input %d is not a tensor of this graph"):format(op, i), 3)
    end
  end
  local name = out_name(g, op, hint)
  local out = new_tensor(g, name, "activation", shape, "f32")
  local n = { op = op, name = name, output = out.id, inputs = {}, segment = g.segment }
  for i, t in ipairs(inputs) do n.inputs[i] = t.id end
  for k, v in pairs(attrs or {}) do n[k] = v end
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

function Graph:embedding(tbl, idx, name)
  local s = copy(idx.shape); s[#s + 1] = tbl.shape[2]
  return node(self, "embedding", { tbl, idx }, s, nil, name)
end

function Graph:add_rows(x, p, name) return node(self, "add_rows", { x, p }, x.shape, nil, name) end

function Graph:add(a, b, name)
  if shape_str(a.shape) ~= shape_str(b.shape) then
    error(("add: %s %s and %s %s differ in shape"):format(a.name, shape_str(a.shape), b.name, shape_str(b.shape)), 2)
  end
  return node(self, "add", { a, b }, a.shape, nil, name)
end

-- y = x @ w^T + b, w: [out, in]
function Graph:linear(x, w, b, name)
  if last(x.shape) ~= w.shape[2] then
    error(("linear: input %s %s has %d features but weight %s %s expects %d"):format(
      x.name, shape_str(x.shape), last(x.shape), w.name, shape_str(w.shape), w.shape[2]), 2)
  end
  local s = copy(x.shape); s[#s] = w.shape[1]
  return node(self, "linear", b and { x, w, b } or { x, w }, s, nil, name)
end

function Graph:matmul(a, b, trans_b, name)
  local s = copy(a.shape)
  s[#s] = trans_b and b.shape[#b.shape - 1] or b.shape[#b.shape]
  return node(self, "matmul", { a, b }, s, { trans_b = trans_b and 1 or 0 }, name)
end

function Graph:layernorm(x, w, b, eps, name)
  return node(self, "layernorm", { x, w, b }, x.shape, { eps = eps or 1e-5 }, name)
end

function Graph:gelu(x, name) return node(self, "gelu", { x }, x.shape, nil, name) end
function Graph:relu(x, name) return node(self, "relu", { x }, x.shape, nil, name) end

function Graph:attention(qkv, heads, name)
  local s = copy(qkv.shape); s[3] = math.floor(s[3] / 3)
  return node(self, "attention", { qkv }, s, { heads = heads }, name)
end

-- Grouped-query attention: q [B,T,heads*D], k and v [B,T,kv_heads*D];
-- query head h reads key/value head floor(h / (heads / kv_heads)).
-- kv_heads = heads is multi-head attention, kv_heads = 1 multi-query.
-- Causal, scale 1/sqrt(D); the output is [B,T,heads*D].
function Graph:gqa_attention(q, k, v, heads, kv_heads, name)
  kv_heads = kv_heads or heads
  for _, t in ipairs { q, k, v } do
    if type(t) ~= "table" or not t.shape or #t.shape ~= 3 then
      error("gqa_attention: q, k and v must be tensors [B,T,heads*D]", 2)
    end
  end
  local W = q.shape[3]
  if type(heads) ~= "number" or heads < 1 or W % heads ~= 0 then
    error(("gqa_attention: %s heads do not divide the width %d of q %s"):format(
      tostring(heads), W, q.name), 2)
  end
  if type(kv_heads) ~= "number" or kv_heads < 1 or heads % kv_heads ~= 0 then
    error(("gqa_attention: %s key/value heads do not divide the %d heads"):format(tostring(kv_heads), heads), 2)
  end
  local D = math.floor(W / heads)
  for _, t in ipairs { k, v } do
    if t.shape[1] ~= q.shape[1] or t.shape[2] ~= q.shape[2] or t.shape[3] ~= kv_heads * D then
      error(("gqa_attention: k/v %s %s must be [%d,%d,%d] (kv_heads %d x head dim %d) to go with q %s %s"):format(
        t.name, shape_str(t.shape), q.shape[1], q.shape[2], kv_heads * D, kv_heads, D, q.name, shape_str(q.shape)), 2)
    end
  end
  return node(self, "attention", { q, k, v }, q.shape, { heads = heads, kv_heads = kv_heads }, name)
end

-- y = x / sqrt(mean(x^2) + eps) * w over the last dimension (RMSNorm)
function Graph:rmsnorm(x, w, eps, name)
  if #w.shape ~= 1 or w.shape[1] ~= last(x.shape) then
    error(("rmsnorm: weight %s %s must be [%d], the last dimension of %s %s"):format(
      w.name, shape_str(w.shape), last(x.shape), x.name, shape_str(x.shape)), 2)
  end
  return node(self, "rmsnorm", { x, w }, x.shape, { eps = eps or 1e-5 }, name)
end

-- Rotary position embedding (Hugging Face's rotate-half pairing (i, i+D/2)):
-- x [B,T,heads*D], D even; position t turns pair i by t * theta^(-2i/D).
function Graph:rope(x, heads, theta, name)
  theta = theta or 10000
  if #x.shape ~= 3 then
    error(("rope: %s %s must be [B,T,heads*D]"):format(x.name, shape_str(x.shape)), 2)
  end
  if type(heads) ~= "number" or heads < 1 or x.shape[3] % heads ~= 0 then
    error(("rope: %s heads do not divide the width %d of %s"):format(tostring(heads), x.shape[3], x.name), 2)
  end
  if math.floor(x.shape[3] / heads) % 2 ~= 0 then
    error(("rope: head dim %d of %s is odd; rotary embedding needs an even head dim"):format(
      math.floor(x.shape[3] / heads), x.name), 2)
  end
  if type(theta) ~= "number" or not (theta > 0 and theta < math.huge) then
    error(("rope: theta must be a finite number above 0, got %s"):format(tostring(theta)), 2)
  end
  return node(self, "rope", { x }, x.shape, { heads = heads, theta = theta }, name)
end

-- silu(gate) * up: the SiLU-gated half of a SwiGLU MLP
function Graph:swiglu(gate, up, name)
  if shape_str(gate.shape) ~= shape_str(up.shape) then
    error(("swiglu: gate %s %s and up %s %s differ in shape"):format(
      gate.name, shape_str(gate.shape), up.name, shape_str(up.shape)), 2)
  end
  return node(self, "swiglu", { gate, up }, gate.shape, nil, name)
end

-- Dropout: in training each element is zeroed with probability p and the
-- rest scaled by 1 / (1 - p); evaluation passes x through
function Graph:dropout(x, p, name)
  if type(p) ~= "number" or not (p > 0 and p < 1) then
    error(("dropout: p must be a number above 0 and below 1, got %s"):format(tostring(p)), 2)
  end
  return node(self, "dropout", { x }, x.shape, { p = p }, name)
end

-- s * x, s a constant (embedding scaling)
function Graph:scale(x, s, name)
  if type(s) ~= "number" or s ~= s or s == math.huge or s == -math.huge then
    error(("scale: the factor must be a finite number, got %s"):format(tostring(s)), 2)
  end
  return node(self, "scale", { x }, x.shape, { scale = s }, name)
end

-- ---- Convolutional ops.  Images are channel-last, x [B,H,W,C] (the layout
-- oneDNN's and cuDNN's fastest convolutions take); conv weights are
-- [OC,KH,KW,IC/groups].  Spatial options are a number n (n x n) or a pair
-- {h, w}.  Per spatial dimension the output is
-- floor((in + 2 pad - dilation (k - 1) - 1) / stride) + 1.

-- {h, w} from a number or a pair of whole numbers >= lo; errors at `level`
-- (default 3: the builder line that called the op calling this)
local function pair(op, key, v, lo, level)
  level = level or 3
  local p = type(v) == "number" and { v, v } or v
  if type(p) ~= "table" or #p ~= 2 then
    error(("%s: %s must be a number or a pair {h, w}, got %s"):format(op, key, tostring(v)), level)
  end
  for i = 1, 2 do
    local d = p[i]
    if type(d) ~= "number" or d ~= math.floor(d) or d < lo or d > 65536 then
      error(("%s: %s must be whole numbers from %d to 65536, got %s"):format(op, key, lo, tostring(d)), level)
    end
  end
  return { p[1], p[2] }
end

local function image(op, x, level)
  if type(x) ~= "table" or not x.shape or #x.shape ~= 4 then
    error(("%s: the input must be an image batch [B,H,W,C] (channel-last), got %s"):format(
      op, x and x.shape and shape_str(x.shape) or tostring(x)), level or 3)
  end
end

-- output size of one spatial dimension, or an error naming the op
local function window_out(op, x, d, k, stride, pad, dilation, level)
  local span = dilation * (k - 1) + 1
  local n = x.shape[1 + d] + 2 * pad - span
  if n < 0 then
    error(("%s: the window %d (dilation %d) does not fit %s %s padded by %d"):format(
      op, k, dilation, x.name, shape_str(x.shape), pad), level or 3)
  end
  return math.floor(n / stride) + 1
end

-- y = conv(x, w) (+ b): x [B,H,W,IC], w [OC,KH,KW,IC/groups], b [OC].
-- opts: stride (1), pad (0), dilation (1), groups (1; IC for depthwise)
function Graph:conv2d(x, w, b, opts, name)
  image("conv2d", x)
  opts = opts or {}
  local stride, pad = pair("conv2d", "stride", opts.stride or 1, 1), pair("conv2d", "pad", opts.pad or 0, 0)
  local dilation = pair("conv2d", "dilation", opts.dilation or 1, 1)
  local groups = opts.groups or 1
  local IC = x.shape[4]
  if #w.shape ~= 4 then
    error(("conv2d: weight %s %s must be [OC,KH,KW,IC/groups]"):format(w.name, shape_str(w.shape)), 2)
  end
  if type(groups) ~= "number" or groups < 1 or groups ~= math.floor(groups) or IC % groups ~= 0
     or w.shape[1] % groups ~= 0 then
    error(("conv2d: groups %s must divide the %d input and %d output channels"):format(
      tostring(groups), IC, w.shape[1]), 2)
  end
  if w.shape[4] ~= IC / groups then
    error(("conv2d: weight %s %s needs %d input channels (%s %s over %d groups)"):format(
      w.name, shape_str(w.shape), IC / groups, x.name, shape_str(x.shape), groups), 2)
  end
  if b and (#b.shape ~= 1 or b.shape[1] ~= w.shape[1]) then
    error(("conv2d: bias %s %s must be [%d]"):format(b.name, shape_str(b.shape), w.shape[1]), 2)
  end
  local s = { x.shape[1], window_out("conv2d", x, 1, w.shape[2], stride[1], pad[1], dilation[1]),
              window_out("conv2d", x, 2, w.shape[3], stride[2], pad[2], dilation[2]), w.shape[1] }
  return node(self, "conv2d", b and { x, w, b } or { x, w }, s,
              { stride = stride, pad = pad, dilation = dilation, groups = groups }, name)
end

-- called by maxpool and avgpool (not as a tail call): errors at level 4
-- are the builder's line
local function pool(g, op, x, kernel, opts, name)
  image(op, x, 4)
  opts = opts or {}
  local k = pair(op, "kernel", kernel, 1, 4)
  local stride = pair(op, "stride", opts.stride or k, 1, 4)
  local pad = pair(op, "pad", opts.pad or 0, 0, 4)
  for i = 1, 2 do
    if pad[i] > math.floor(k[i] / 2) then
      error(("%s: padding %d is more than half the window %d"):format(op, pad[i], k[i]), 3)
    end
  end
  local s = { x.shape[1], window_out(op, x, 1, k[1], stride[1], pad[1], 1, 4),
              window_out(op, x, 2, k[2], stride[2], pad[2], 1, 4), x.shape[4] }
  return node(g, op, { x }, s, { kernel = k, stride = stride, pad = pad }, name)
end

-- max over each kernel window (padding never wins); opts: stride (the window), pad (0)
function Graph:maxpool(x, kernel, opts, name)
  local y = pool(self, "maxpool", x, kernel, opts, name)
  return y
end
-- mean over each kernel window, padding counted as zeros; opts as maxpool
function Graph:avgpool(x, kernel, opts, name)
  local y = pool(self, "avgpool", x, kernel, opts, name)
  return y
end

-- x [B,H,W,C] -> [B,C], the mean over H and W
function Graph:global_avgpool(x, name)
  image("global_avgpool", x)
  return node(self, "global_avgpool", { x }, { x.shape[1], x.shape[4] }, nil, name)
end

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
  local C = last(x.shape)
  if #x.shape < 2 then
    error(("batchnorm: %s %s needs a batch dimension and channels last"):format(x.name, shape_str(x.shape)), 2)
  end
  if w.shape[1] ~= C or b.shape[1] ~= C or #w.shape ~= 1 or #b.shape ~= 1 then
    error(("batchnorm: weight %s and bias %s must be [%d], the channels of %s %s"):format(
      w.name, b.name, C, x.name, shape_str(x.shape)), 2)
  end
  if type(running) ~= "table" or running.role ~= "buffer" or shape_str(running.shape) ~= shape_str { 2, C } then
    error(("batchnorm: running must be a buffer [2,%d] (g:buffer)"):format(C), 2)
  end
  local momentum, eps = opts.momentum or 0.1, opts.eps or 1e-5
  if type(momentum) ~= "number" or not (momentum > 0 and momentum <= 1) then
    error(("batchnorm: momentum must be above 0 and at most 1, got %s"):format(tostring(momentum)), 2)
  end
  if type(eps) ~= "number" or not (eps > 0 and eps < 1) then
    error(("batchnorm: eps must be between 0 and 1, got %s"):format(tostring(eps)), 2)
  end
  return node(self, "batchnorm", { x, w, b }, x.shape,
              { eps = eps, momentum = momentum, buffer = running.id }, name)
end

function Graph:cross_entropy(logits, targets, ignore_index, name)
  return node(self, "cross_entropy", { logits, targets }, { 1 }, { ignore_index = ignore_index or -1 }, name or "loss")
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

-- A convolution layer named prefix.weight [OC,KH,KW,IC/groups] (He init,
-- std sqrt(2 / fan_in)) and prefix.bias unless opts.bias == false.
-- kernel: a number or {KH, KW}; opts as conv2d, plus std.
function Graph:Conv2d(prefix, x, out_channels, kernel, opts)
  opts = opts or {}
  image("Conv2d", x)
  local k = pair("Conv2d", "kernel", kernel, 1)
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
