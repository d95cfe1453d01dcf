//! Owns the help texts of `seckill-reconciler`: one [`Help`] entry per
//! command in [`COMMANDS`], from which the command list of `--help`, each
//! command's own `COMMAND --help`, the subcommand list of a group
//! (`sale`, `token`) and the name of a missing argument are all made. A new
//! command adds one entry here and one match arm in `cli.rs`.

/// The help of one command.
#[derive(Debug, PartialEq, Eq)]
pub struct Help {
    /// The words that name the command: `run`, `sale create`.
    pub path: &'static str,
    /// Its positional arguments, in order; an optional one in brackets
    /// (`[SALE]`), which may only come last.
    pub args: &'static [&'static str],
    /// One line for the command list.
    pub summary: &'static str,
    /// The rest of its usage line after the path and arguments (options).
    pub options: &'static str,
    /// What it does and what each option means.
    pub text: &'static str,
}

impl Help {
    /// The positional arguments that must be given.
    pub fn required(&self) -> usize {
        self.args.iter().filter(|a| !a.starts_with('[')).count()
    }

    /// The usage line: `usage: seckill-reconciler PATH ARGS OPTIONS`.
    pub fn usage(&self) -> String {
        let mut line = format!("usage: {PROGRAM} {}", self.path);
        for a in self.args {
            line.push(' ');
            line.push_str(a);
        }
        if !self.options.is_empty() {
            line.push(' ');
            line.push_str(self.options);
        }
        line
    }

    /// The whole text `PATH --help` prints.
    pub fn full(&self) -> String {
        format!("{}\n\n{}", self.usage(), self.text.trim_end())
    }
}

/// The program's name as the operator types it.
pub const PROGRAM: &str = "seckill-reconciler";

/// Every command, in the order `--help` lists them.
pub const COMMANDS: &[Help] = &[
    Help {
        path: "migrate",
        args: &[],
        summary: "create the MySQL database if missing and apply the schema",
        options: "",
        text: "Creates the database SECKILL_MYSQL_URL names when it is missing and applies
the schema migrations it lacks; prints what it applied. Safe to repeat.",
    },
    Help {
        path: "sale create",
        args: &[],
        summary: "create a sale in MySQL and load it into Redis",
        options: "--sku SKU --stock N --starts-at T --ends-at T [--title TEXT] \
                  [--price-cents N] [--payment-window D [--rebuy-after-release]] [--shards K] \
                  [--max-per-buyer L [--max-per-purchase Q]]",
        text: "Creates a sale in MySQL and loads it into Redis; prints its id.

options:
  --sku SKU                 1-64 characters of A-Z a-z 0-9 _ . -
  --stock N                 units on sale, 1 to 100000000
  --starts-at T, --ends-at T
                            RFC 3339 (2026-11-29T20:00:00Z, +08:00 offsets too), now,
                            now+30s, now+2h; the window at most 366 days
  --title TEXT              at most 255 characters
  --price-cents N           the price, integer cents (default 0)
  --payment-window D        15m, 30s, 500ms: orders wait that long for their payment,
                            then their unit goes back on sale (default: none, orders
                            are final at creation)
  --rebuy-after-release     (with --payment-window) the buyer of an expired or
                            cancelled order may buy again
  --shards K                split the stock over K buckets (1-64, default 1), each
                            under its own hash tag (a released order's units go back
                            to its buyer's home bucket)
  --max-per-buyer L         units one buyer may hold at once (1-100, default 1):
                            queued, pending payment or paid; above 1 a purchase needs an
                            Idempotency-Key header. A split sale counts a buyer's units
                            in their home bucket and takes a purchase whole from it,
                            moving units there from other buckets when it holds too few
  --max-per-purchase Q      units one purchase may take (1 to L, default L)",
    },
    Help {
        path: "sale load",
        args: &["ID"],
        summary: "put a MySQL sale into Redis unless Redis holds live state",
        options: "[--shards K]",
        text: "Puts sale ID from MySQL into Redis unless Redis already holds live state of it.

options:
  --shards K    the sale's K, which MySQL keeps; only for a sale created before
                migration 5, or to repeat the same K

exit 1: refused, nothing changed: the sale is archived, paused (sale resume ID
--by NAME first), or Redis lost it since its load (run, then sale repair ID
--by NAME).",
    },
    Help {
        path: "sale list",
        args: &[],
        summary: "one line per sale: window, state, units, pause",
        options: "",
        text: "One line per sale in MySQL: id, SKU, window (UTC), state (upcoming, active,
sold_out, ended, paused, archived), units total / left / reserved / ordered /
paid, and who paused it and why. left: Redis's stock (every bucket), MySQL's
available stock when Redis does not hold the sale; reserved: units taken in
Redis (total - left); ordered: MySQL orders holding a unit; paid: of those,
paid. Changes nothing. Exit 0, 2 could not run.",
    },
    Help {
        path: "sale pause",
        args: &["ID"],
        summary: "refuse every purchase of a sale until sale resume",
        options: "--reason TEXT --by NAME [--dry-run]",
        text: "Refuses every purchase of sale ID (503 sale_paused, Retry-After) on every
gateway within a second, until `sale resume ID`. Reads, payments,
cancellations, expiries and the workers go on. Refused for a sale that has
ended (its buyers hear 403 sale_ended). Audited in the review store.
TEXT: 1-255 characters. Exit 0 paused (or paused already), 1 refused (nothing
changed), 2 could not run.",
    },
    Help {
        path: "sale resume",
        args: &["ID"],
        summary: "end an operator's pause of a sale",
        options: "--by NAME [--dry-run]",
        text: "Ends an operator's pause of sale ID: purchases are taken again within a
second. Refused while the sale is paused because Redis lost data of it (an
open redis_data_loss finding, or the data-loss pause in MySQL): `sale repair
ID --by NAME` ends that pause. Audited in the review store. Exit 0 resumed (or
not paused), 1 refused, 2 could not run.",
    },
    Help {
        path: "sale end",
        args: &["ID"],
        summary: "end a sale now",
        options: "--by NAME [--dry-run]",
        text: "Ends sale ID one second from now by Redis's clock (a sale not started yet:
a millisecond after its start): the same end in MySQL and in every bucket,
each written before it arrives, so no purchase is taken at or after it;
later purchases get 403 sale_ended. A sale that ends within that second
anyway is left to end. A bucket written after the end had passed is named
in the output, and `run` reports each order it took (order_outside_window).
Payments, cancellations and expiries of its orders go on. Audited in the
review store. Exit 0 ended (or ends already), 1 refused, 2 could not run.",
    },
    Help {
        path: "sale extend",
        args: &["ID"],
        summary: "move a sale's end later",
        options: "--ends-at T --by NAME [--dry-run]",
        text: "Moves the end of sale ID later, to T (RFC 3339, now+2h): a sale that had
ended takes purchases again. T must be after now and after the current end
(`sale end` ends a sale earlier), the window at most 366 days. Audited in the
review store. Exit 0 extended, 1 refused, 2 could not run.",
    },
    Help {
        path: "sale add-stock",
        args: &["ID", "N"],
        summary: "put N more units of a sale on sale",
        options: "--by NAME [--dry-run]",
        text: "Puts N more units of sale ID on sale, in MySQL (total_stock and
available_stock, a stock_ledger row of reason add_stock) and in Redis (its
stock) at once; buyers see them within a second. A split sale's units go so
that each bucket holds its share of the new total (printed per bucket).
Refused for an ended or archived sale and while Redis lost data of it.
Audited in the review store. Exit 0 added, 1 refused, 2 could not run.",
    },
    Help {
        path: "sale show",
        args: &["ID"],
        summary: "MySQL and Redis figures side by side (per bucket)",
        options: "",
        text: "Prints sale ID's figures in MySQL and in Redis side by side, per bucket for a
split sale. Changes nothing.",
    },
    Help {
        path: "sale rebalance",
        args: &["ID"],
        summary: "complete half-done transfers between buckets, refill empty ones",
        options: "",
        text: "Completes the half-done transfers between sale ID's buckets and moves units to
empty ones.

exit 1: the sale is archived (refused, nothing changed).",
    },
    Help {
        path: "sale repair",
        args: &["ID"],
        summary: "rebuild a sale's Redis state from MySQL after Redis lost it",
        options: "--by NAME [--note TEXT] [--dry-run]",
        text: "Rebuilds sale ID's Redis state from MySQL after Redis lost data of it (an open
redis_data_loss finding: a paused sale, or an ended one that lost its keys) and
resumes it; writes an archived sale's tombstone again when Redis lost it.
Audited in the review store.

options:
  --by NAME     who acts: 1-64 characters of A-Z a-z 0-9 _ . - @
  --note TEXT   why, at most 1000 characters
  --dry-run     print what the repair would write; change nothing, record nothing

exit 1: refused (no open redis_data_loss finding yet: run first; or a worker
holds messages of the sale), nothing changed; 2 could not run (no review file
at SECKILL_REVIEW_DB, no such sale).",
    },
    Help {
        path: "sale archive",
        args: &["ID"],
        summary: "remove an ended sale's Redis keys once it is settled",
        options: "--by NAME",
        text: "Removes ended sale ID's Redis keys (a tombstone stays) once every order is
final and a run found it clean; audited in the review store. `run` does it by
itself SECKILL_ARCHIVE_AFTER past the end (default 1h, off: never).

options:
  --by NAME     who acts: 1-64 characters of A-Z a-z 0-9 _ . - @

exit 1: refused, nothing changed.",
    },
    Help {
        path: "run",
        args: &[],
        summary: "reconcile every active or recent sale",
        options: "",
        text: "Reconciles every sale active or ended within SECKILL_RECONCILE_LOOKBACK: records
findings in the review store (SECKILL_REVIEW_DB, created when missing), fixes what
it may by itself, prints a summary.

exit 1: open findings remain.",
    },
    Help {
        path: "findings",
        args: &[],
        summary: "list findings from the review store",
        options: "[--state open|auto_fixed|resolved|all] [--sale ID] [--json]",
        text: "Lists findings from the review store, one a line (evidence cut to fit);
`findings show ID` prints one whole.

options:
  --state S     open (default), auto_fixed, resolved or all
  --sale ID     only this sale (0: the payment queue's)
  --json        a JSON array, every field whole",
    },
    Help {
        path: "findings show",
        args: &["ID"],
        summary: "one finding whole: its evidence and every action on it",
        options: "[--json]",
        text: "Prints finding ID whole: every field, its evidence pretty-printed, and every
row of the audit log about it (started rows and their completions). Changes
nothing.

options:
  --json        one JSON object: {\"finding\": {...}, \"actions\": [...]}",
    },
    Help {
        path: "resolve",
        args: &["FINDING_ID"],
        summary: "act on a finding (reorder, rollback, recreate or dismiss)",
        options:
            "(--reorder | --rollback | --recreate | --dismiss) --by NAME [--note TEXT] [--dry-run]",
        text: "Acts on finding FINDING_ID; audited in the review store (a started row before
the effect, its completion after).

options:
  --reorder     queue the order message again
  --rollback    release the reservation in Redis (stock +1); refused for a
                reservation MySQL holds or deducted
  --recreate    make the order of a ledger deduction without order again
                (ledger_without_order), without a second deduction
  --dismiss     close the finding with the note
  --by NAME     who acts: 1-64 characters of A-Z a-z 0-9 _ . - @
  --note TEXT   why, at most 1000 characters
  --dry-run     print what would change; change nothing, record nothing

exit 1: refused (the line says why), nothing changed; 2 could not run (no such
finding included).",
    },
    Help {
        path: "resolve all",
        args: &[],
        summary: "act on every open finding of one kind of one sale",
        options: "--kind KIND --sale ID (--reorder | --rollback | --recreate | --dismiss) \
                  --by NAME [--note TEXT] [--dry-run]",
        text: "Acts on every open finding of kind KIND of sale ID, oldest first, each exactly as
`resolve FINDING_ID` does: its checks, its own audit rows (a started row before
the effect, its completion after), its own line; then a total. Killed part-way,
no finding is acted on twice: run it again for the rest.

options:
  --kind KIND   flow_without_order, dead_letter, ... (`findings` shows them)
  --sale ID     the sale (0: the payment queue's findings)
  --reorder, --rollback, --recreate, --dismiss, --by, --note, --dry-run
                as for `resolve`

exit 0: every finding acted on (or nothing open); 1: some refused (the others
were acted on; their lines say which); 2 could not run.",
    },
    Help {
        path: "queue show",
        args: &["[SALE]"],
        summary: "queue lengths, processing lists, dead letters by reason",
        options: "",
        text: "Prints, for sale SALE (default: every sale in Redis) and then for the payment
queue: the messages queued, each worker's processing list with the age of its
oldest message and whether the worker's heartbeat is present, and the dead
letters counted by reason. Reads long lists in pages; changes nothing.",
    },
    Help {
        path: "dead-letter list",
        args: &["SALE"],
        summary: "a sale's dead letters, or the payment queue's (SALE: payments)",
        options: "",
        text: "Lists the dead letters of sale SALE (every bucket), or of the payment queue when
SALE is `payments`, one a line. A sale's entry is named as its dead_letter finding
(the reservation id); a payment entry by `entry` (what requeue and drop take) and
by its finding's subject. A sale Redis does not hold (a wrong id, an archived
sale) says `not in Redis`. Changes nothing.",
    },
    Help {
        path: "dead-letter requeue payments",
        args: &["ENTRY"],
        summary: "put a payment dead letter back on the payment queue",
        options: "--by NAME [--note TEXT] [--dry-run]",
        text: "Puts payment dead letter ENTRY (its entry, or its finding's subject such as
payment:pay-7 when one entry has it) back on the payment queue with its failed
attempts cleared, in one step with its removal; audited in the review store as
requeue_payment. Its open dead_letter finding is resolved by NAME, with the note.

options:
  --by NAME     who acts: 1-64 characters of A-Z a-z 0-9 _ . - @
  --note TEXT   why, at most 1000 characters
  --dry-run     print what would change; change nothing, record nothing

exit 1: refused (a message the worker cannot read: drop it), nothing changed;
2 could not run (no such entry, or several: name it by its entry).",
    },
    Help {
        path: "dead-letter drop",
        args: &["SALE", "ENTRY"],
        summary: "remove a sale's dead letter that names no reservation (kept in its archive)",
        options: "--by NAME --note TEXT [--dry-run]",
        text: "Removes dead letter ENTRY of sale SALE (as `dead-letter list SALE` names it:
entry:HEX, or HEX) when it names no reservation: a message that does not parse,
one of another sale, anything pushed onto the list by hand. It moves to the
bucket's seckill:{sale:ID}:dlq:archive, wrapped with the action, so it leaves
`dead-letter list`, `queue show` and the dead-letter gauge. Audited in the review
store as drop_dead_letter; its open dead_letter finding is resolved by NAME, with
the note. An entry naming a reservation holds a unit: settle it with `resolve ID
--reorder` or `--rollback` instead.

options:
  --by NAME     who acts: 1-64 characters of A-Z a-z 0-9 _ . - @
  --note TEXT   why it is dropped (required), at most 1000 characters
  --dry-run     print what would change; change nothing, record nothing

exit 1: refused (the entry names a reservation), nothing changed; 2 could not run
(no such entry in the sale, Redis, MySQL or the review file unreachable).",
    },
    Help {
        path: "dead-letter drop payments",
        args: &["ENTRY"],
        summary: "remove a payment dead letter (kept in the settled hash)",
        options: "--by NAME --note TEXT [--dry-run]",
        text: "Removes payment dead letter ENTRY (its entry, or its finding's subject) once the
money or the cancellation was settled by hand; the entry is kept in
seckill:{payments}:dlq:settled under the action. A payment's receipt is removed in
the same step and the payment recorded in MySQL as `dropped`, so neither the
expiry sweep at the order's pay_by nor a redelivery applies it; a payment MySQL
had applied already is named with its outcome, which stands. Audited in the
review store as drop_payment; its open dead_letter finding is resolved by NAME,
with the note.

options:
  --by NAME     who acts: 1-64 characters of A-Z a-z 0-9 _ . - @
  --note TEXT   why the payment is not applied (required)
  --dry-run     print what would change; change nothing, record nothing

exit 2: could not run (no such entry, or several: name it by its entry; Redis or
MySQL unreachable), nothing changed; MySQL failing after the entry was removed
also exits 2, and the next of these commands or run records the payment as
dropped.",
    },
    Help {
        path: "token keygen",
        args: &[],
        summary: "add a new random signing key to a key file",
        options: "--alg HS256|EdDSA --kid KID --out FILE [--public FILE]",
        text: "Adds a new random key to the signing key file FILE (JWKS, created when
missing) and its verifying half to --public FILE (the gateway's
SECKILL_AUTH_KEYS); prints the kid.

options:
  --alg A       HS256 or EdDSA
  --kid KID     1-64 characters of A-Z a-z 0-9 _ . -
  --out FILE    the signing key file
  --public FILE the gateway's key file",
    },
    Help {
        path: "token issue",
        args: &[],
        summary: "print a buyer token",
        options: "--user U --key FILE [--ttl 10m] [--kid KID] [--audience A] [--count N]",
        text: "Prints a buyer token for U signed with KID.

options:
  --user U      the buyer: 1-64 characters of A-Z a-z 0-9 _ . -
  --key FILE    the signing key file
  --ttl D       lifetime, 1s to 30d (default 10m); the gateway refuses one longer
                than its SECKILL_AUTH_MAX_TTL (default 24h): a warning says so
  --kid KID     the key (default: the file's last key that can sign)
  --audience A  default SECKILL_AUTH_AUDIENCE
  --count N     N tokens, one a line, for users U-0 .. U-(N-1) (benchmarks)",
    },
];

/// The top-level `--help`.
pub fn overview() -> String {
    let mut s = format!("usage: {PROGRAM} COMMAND [ARGS] [OPTIONS]\n\ncommands:\n");
    for h in COMMANDS {
        s.push_str(&list_line(h));
    }
    s.push_str(&format!(
        "\nrun `{PROGRAM} COMMAND --help` for a command's arguments and options.
configuration comes from SECKILL_* environment variables (see README).
exit codes: 0 ok, 1 open findings (run) or a refused command (the state found
does not allow it; nothing changed), 2 could not run (an unknown sale, finding
or entry included), 64 bad command line"
    ));
    s
}

/// The `--help` of `group` (`sale`): its subcommands, or `None` when no
/// command starts with that word.
pub fn group(group: &str) -> Option<String> {
    let g = group_name(group)?;
    Some(format!(
        "usage: {PROGRAM} {g} SUBCOMMAND [ARGS] [OPTIONS]\n\nsubcommands:\n{}\n\n\
         run `{PROGRAM} {g} SUBCOMMAND --help` for its arguments and options.",
        subcommands(g)
    ))
}

/// `word` as the name of a group of subcommands (`sale`, `token`), or
/// `None` when it is not one.
pub fn group_name(word: &str) -> Option<&'static str> {
    COMMANDS
        .iter()
        .find_map(|h| h.path.split_once(' ').filter(|(g, _)| *g == word))
        .map(|(g, _)| g)
}

/// The list lines of `group`'s subcommands, without the last newline.
pub fn subcommands(group: &str) -> String {
    let mut s = String::new();
    for h in COMMANDS
        .iter()
        .filter(|h| h.path.split_once(' ').is_some_and(|(g, _)| g == group))
    {
        s.push_str(&list_line(h));
    }
    s.trim_end().to_string()
}

/// `  PATH ARGS    SUMMARY`, the summaries of every list aligned.
fn list_line(h: &Help) -> String {
    let width = COMMANDS.iter().map(|c| name(c).len()).max().unwrap_or(0) + 2;
    format!("  {:<width$}{}\n", name(h), h.summary)
}

/// `PATH ARGS`.
fn name(h: &Help) -> String {
    let mut name = h.path.to_string();
    for a in h.args {
        name.push(' ');
        name.push_str(a);
    }
    name
}

/// The command whose path is the longest prefix of `words`, with how many
/// words it takes.
pub fn find(words: &[&str]) -> Option<&'static Help> {
    COMMANDS
        .iter()
        .filter(|h| {
            let path: Vec<&str> = h.path.split(' ').collect();
            words.len() >= path.len() && words[..path.len()] == path[..]
        })
        .max_by_key(|h| h.path.len())
}

/// The command of more than two words whose first two `words` are (`dead-letter
/// requeue` of `dead-letter requeue payments`), when `words` name none.
pub fn partial(words: &[&str]) -> Option<&'static Help> {
    COMMANDS.iter().find(|h| {
        let path: Vec<&str> = h.path.split(' ').collect();
        path.len() > 2 && words.len() >= 2 && path[..2] == words[..2]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_its_own_help_and_a_unique_path() {
        for (i, h) in COMMANDS.iter().enumerate() {
            assert!(
                COMMANDS[i + 1..].iter().all(|o| o.path != h.path),
                "{}",
                h.path
            );
            assert_eq!(find(&h.path.split(' ').collect::<Vec<_>>()), Some(h));
            assert!(!h.text.is_empty() && !h.summary.is_empty(), "{}", h.path);
            let optional = h.args.iter().position(|a| a.starts_with('['));
            assert!(
                optional.is_none_or(|p| p == h.args.len() - 1),
                "{}: an optional argument only last",
                h.path
            );
        }
    }
}
