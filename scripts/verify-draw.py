#!/usr/bin/env python3
"""Checks a published draw with Python's standard library only.

Usage: scripts/verify-draw.py DRAW.json [--buyer SALE_ID:USER_ID]

DRAW.json holds what a draw publishes: "units" (the sale's units), "seed"
(64 hex digits, revealed at the draw), "commitment" (published at the
sale's creation), "public_value" (empty when none), "entries" (each
{"buyer_hash", "quantity"}) and "winners" (the winning buyer hashes in draw
order). The rules are those of common/src/draw.rs:

- commitment = hex(SHA-256(seed));
- entries digest = hex(SHA-256 of the sorted lines "BUYER_HASH,QUANTITY\\n");
- draw key = HMAC-SHA256(seed, "seckill-draw-key\\n" + digest + "\\n" + public value);
- order: entries by hex(HMAC-SHA256(draw key, buyer hash)), then buyer hash;
- units down that order: an entry that fits wins its whole quantity, one
  that does not is skipped.

--buyer SALE_ID:USER_ID prints that buyer's hash and where it stands.
Exit 0 when every figure matches, 1 when one does not (it says which), 2 on
a file it cannot read.
"""
import hashlib
import hmac
import json
import sys


def buyer_hash(sale_id, user_id):
    return hashlib.sha256(f"seckill-draw-buyer\n{sale_id}\n{user_id}".encode()).hexdigest()


def recompute(d):
    seed = bytes.fromhex(d["seed"])
    lines = sorted(f'{e["buyer_hash"]},{e["quantity"]}\n' for e in d["entries"])
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    key = hmac.new(seed, f'seckill-draw-key\n{digest}\n{d.get("public_value", "")}'.encode(),
                   hashlib.sha256).digest()
    order = sorted(d["entries"], key=lambda e: (
        hmac.new(key, e["buyer_hash"].encode(), hashlib.sha256).hexdigest(), e["buyer_hash"]))
    left, winners, waitlist = int(d["units"]), [], []
    for e in order:
        q = int(e["quantity"])
        if 0 < q <= left:
            left -= q
            winners.append(e["buyer_hash"])
        else:
            waitlist.append(e["buyer_hash"])
    return hashlib.sha256(seed).hexdigest(), digest, winners, waitlist


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--buyer"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8") as f:
            d = json.load(f)
        commitment, digest, winners, waitlist = recompute(d)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"verify-draw: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 2
    wrong = []
    if commitment != d["commitment"]:
        wrong.append(f"the seed's SHA-256 is {commitment}, the commitment {d['commitment']}")
    if "entries_digest" in d and digest != d["entries_digest"]:
        wrong.append(f"the entries' digest is {digest}, the draw says {d['entries_digest']}")
    if winners != d["winners"]:
        wrong.append(f"the winners recomputed ({len(winners)}) differ from those published "
                     f"({len(d['winners'])}), first at position "
                     f"{next((i for i, (a, b) in enumerate(zip(winners, d['winners'])) if a != b), min(len(winners), len(d['winners'])))}")
    if len(argv) == 4:
        sale_id, _, user = argv[3].partition(":")
        h = buyer_hash(sale_id, user)
        place = (f"won (position {winners.index(h) + 1})" if h in winners else
                 f"waitlisted (position {waitlist.index(h) + 1})" if h in waitlist else "not entered")
        print(f"buyer {user}: hash {h}: {place}")
    for w in wrong:
        print(f"verify-draw: MISMATCH: {w}")
    if wrong:
        return 1
    units = sum(int(e["quantity"]) for e in d["entries"] if e["buyer_hash"] in set(winners))
    print(f"draw verified: {len(d['entries'])} entries, digest {digest}, "
          f"{len(winners)} winners ({units} units of {d['units']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
