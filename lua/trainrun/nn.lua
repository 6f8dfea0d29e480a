-- trainrun.nn: builds a static graph from the ops the kernels provide.
--
-- A model builder receives (nn, spec, batch) and returns g:finish{...}.
-- Tensors are handles {id, shape, dtype}; shapes are checked here so that a
-- mistake is reported at the line of the builder that made it, and checked
-- again by the core before any memory is planned.
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

-- The graph as plain tables for the core.  loss is required; logits lets
-- `trainrun sample` read predictions.
function Graph:finish(outputs)
  if not outputs or not outputs.loss then error("finish{loss = ...}: a model must end in a loss", 2) end
  return { batch = self.batch, tensors = self.tensors, nodes = self.nodes, inputs = self.inputs,
           loss = outputs.loss.id, logits = outputs.logits and outputs.logits.id or nil }
end

return nn
