//! Owns the Lua pieces shared by every script that writes: the key-type
//! guard that lets a script check, before its first write, that none of its
//! writes can fail.
//!
//! Redis keeps the writes a script made before an error, so a script that
//! fails half-way leaves a half-written state (issue 10 §2: a string where
//! the queue list should be made the `LPUSH` fail after the `DECR`). Every
//! script that writes therefore starts with `expect_types(...)` over each
//! key it writes and returns its error reply, unchanged, when one is of the
//! wrong type. The error names the key, so the caller can log it.

/// Lua source of `expect_types(pairs)`: `pairs` is a flat table
/// `{key1, type1, key2, type2, ...}` with Redis type names (`string`,
/// `hash`, `list`, `set`). Returns `nil` when every key is absent or of its
/// type, else an error reply `WRONGTYPE <key> holds a <t>, expected a <type>`.
/// A macro so that scripts can `concat!` it in front of their own source.
#[macro_export]
macro_rules! lua_expect_types {
    () => {
        r#"
local function expect_types(pairs)
  for i = 1, #pairs, 2 do
    local t = redis.call('TYPE', pairs[i])['ok']
    if t ~= 'none' and t ~= pairs[i + 1] then
      return redis.error_reply('WRONGTYPE ' .. pairs[i] .. ' holds a ' .. t .. ', expected a ' .. pairs[i + 1])
    end
  end
  return nil
end
"#
    };
}
