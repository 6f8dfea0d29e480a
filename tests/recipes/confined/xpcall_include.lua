-- netrc.txt lies inside: it is read, and its parse error (which quotes it)
-- ends the load; neither the handler nor the value sees it.
local stolen
xpcall(function() return include "netrc.txt" end, function(e) stolen = e end)
return { seed = 7, stolen = stolen }
