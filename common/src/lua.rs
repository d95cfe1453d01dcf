//! Owns the Lua pieces shared by every script that writes: the key-type
//! guard that lets a script check, before its first write, that none of its
//! writes can fail.
//!
//! Redis keeps the writes a script made before an error, so a script that
//! fails half-way leaves a half-written state (a string where the queue
//! list should be makes the `LPUSH` fail after the `DECR`). Every
//! script that writes therefore checks, before its first write, each key it
//! writes with `expect_types({...})`, which returns an error reply naming
//! the key, so the caller can log it. (The reservation script, the hot
//! path, does without: see `reservation.rs`.)

/// Lua source of two functions:
/// - `expect_type(key, type)`: `nil` when `key` is absent or of `type`
///   (`string`, `hash`, `list`, `set`), else the error reply
///   `WRONGTYPE <key> holds a <t>, expected a <type>`;
/// - `expect_types(pairs)`: the same over a flat table
///   `{key1, type1, key2, type2, ...}`, the first error wins.
///
/// A macro so that scripts can `concat!` it in front of their own source.
#[macro_export]
macro_rules! lua_expect_types {
    () => {
        r#"
local function expect_type(key, want)
  local t = redis.call('TYPE', key)['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE ' .. key .. ' holds a ' .. t .. ', expected a ' .. want)
  end
  return nil
end
local function expect_types(pairs)
  for i = 1, #pairs, 2 do
    local bad = expect_type(pairs[i], pairs[i + 1])
    if bad then return bad end
  end
  return nil
end
"#
    };
}
