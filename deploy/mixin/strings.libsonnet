// String helpers that behave the same on every jsonnet a mixin user has: go-jsonnet, and the C++
// jsonnet of PyPI (0.20+) and of Debian 12 (0.18), whose std.split and std.splitLimit take only a
// one-character separator.
local mark = '\u001f';  // ASCII unit separator: no template or dashboard text holds it

{
  // text split at every occurrence of sep (any length), as std.split does on jsonnet >= 0.19
  split(text, sep)::
    assert std.length(std.split(text, mark)) == 1 : 'text holds U+001F';
    std.split(std.strReplace(text, sep, mark), mark),
}
