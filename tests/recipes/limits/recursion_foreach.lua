local t = {}
t[t] = table.foreach
table.foreach(t, table.foreach)
return {}
