//! Owns the Lua pieces shared by the scripts: the key-type guard that lets
//! a script that writes check, before its first write, that none of its
//! writes can fail; and the reservation scripts' common steps (a refusal
//! naming its key, the stock read, Redis's clock), written once so the
//! one-unit script (`reservation.rs`) and the units script
//! (`reserve_units.rs`) cannot drift apart.
//!
//! Redis keeps the writes a script made before an error, so a script that
//! fails half-way leaves a half-written state (a string where the queue
//! list should be makes the `LPUSH` fail after the `DECR`). Every
//! script that writes therefore checks, before its first write, each key it
//! writes with `expect_types({...})`, which returns an error reply naming
//! the key, so the caller can log it. (The reservation script, the hot
//! path, does without: see `reservation.rs`.)
//!
//! Each piece is a macro expanding to a string literal, so that a script
//! can `concat!` it into its source. The reservation steps begin with a
//! newline and end without one: the script's own text around them begins
//! a line after them and ends the line before them.

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

/// Lua source of `refused(key, r)`: the error reply of `r`, a `pcall`'s
/// error table, with the key it came from appended (`WRONGTYPE ...
/// (seckill:sale:7:stock)`), so the caller's log names the key.
#[macro_export]
macro_rules! lua_refused {
    () => {
        r#"
local function refused(key, r)
  return redis.error_reply(r['err'] .. ' (' .. key .. ')')
end"#
    };
}

/// Lua source that reads the stock counter `KEYS[2]` into `stock` (absent:
/// 0), before any write: a key of another type is refused naming it
/// (`refused`, [`lua_refused!`]), a string that is not an integer is the
/// error reply `ERR <key> is not an integer`.
#[macro_export]
macro_rules! lua_read_stock {
    () => {
        r#"
local left = redis.pcall('GET', KEYS[2])
if type(left) == 'table' then return refused(KEYS[2], left) end
if left and not string.find(left, '^-?%d+$') then
  return redis.error_reply('ERR ' .. KEYS[2] .. ' is not an integer')
end
local stock = tonumber(left or '0')"#
    };
}

/// Lua source that sets `now` to Redis's clock in milliseconds (`TIME`:
/// the gateways' clocks do not matter).
#[macro_export]
macro_rules! lua_now {
    () => {
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)"#
    };
}
