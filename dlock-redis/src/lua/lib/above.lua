-- Library: compares two decimal tokens of any length as numbers, a longer one being the
-- larger, else the text order deciding: Lua's numbers lose precision above 2^53, and
-- tokens reach 2^64. Put in front of the scripts that compare tokens.
--
-- KEYS: none (it touches no key).
-- ARGV: none.
-- Returns: nothing; defines above(a, b), whether token a is above token b.
-- Invariant: for decimal strings without leading zeros (as every token is written),
--   above(a, b) is a > b as integers, at any size.

local function above(a, b)
  if #a ~= #b then
    return #a > #b
  end
  return a > b
end
