-- A recipe whose data file does not exist (for --smoke).
return {
  model = gpt { vocab = 256, ctx = 8, layers = 1, heads = 2, dim = 16 },
  data = { plugin = "text", path = "no/such/file.txt" },
}
