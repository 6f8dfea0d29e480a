local steps = 10
if steps > 5 then
    error("steps must be at most 5")
end
return { steps = steps }
