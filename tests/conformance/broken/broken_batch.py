"""A raw bolt speaking extension batch (§9.5), broken in the way argv[1] says.

good           accepts batch only when offered; acks every input in one output batch
split          as good, but one output batch per input (a writer may close a batch early, §9.5)
split-short    as split, but the last input of a tuple batch is never acked
unoffered      accepts batch even when nothing was offered (§9.2)
twice          accepts ["batch", "batch"] (§9.2)
unnegotiated   never accepts, but writes output batches anyway (§9.3)
numeric-ack    acks with the id as a JSON number (§3.6)
unknown-ack    acks an id it was never sent (§3.6)
double-ack     acks the same id twice in one batch (§3.6)
bad-anchor     anchors a batched emit to an unknown id (§3.5)
"""

import os
import sys

from _raw import frames, is_heartbeat, send

MODE = sys.argv[1] if len(sys.argv) > 1 else "good"


def main():
    messages = frames()
    try:
        hs = next(messages)
    except StopIteration:
        return
    pid = os.getpid()
    open(os.path.join(hs["pidDir"], str(pid)), "w").close()
    offered = hs.get("extensions") or []
    accept = ["batch"] if "batch" in offered else []
    if MODE == "unoffered":
        accept = ["batch"]
    elif MODE == "twice" and accept:
        accept = ["batch", "batch"]
    elif MODE == "unnegotiated":
        accept = []
    send({"pid": pid, "extensions": accept} if accept else {"pid": pid})
    batching = bool(accept) or MODE == "unnegotiated"
    for msg in messages:
        if isinstance(msg, list):
            continue
        if is_heartbeat(msg):
            send({"command": "sync"})
            continue
        ids = [t[0] for t in msg["tuples"]] if "tuples" in msg else [msg["id"]]
        if not batching:
            for tid in ids:
                send({"command": "ack", "id": tid})
            continue
        if MODE in ("split", "split-short"):
            for tid in ids[:-1] if MODE == "split-short" and len(ids) > 1 else ids:
                send({"command": "batch", "acks": [tid]})
            continue
        out = {"command": "batch", "acks": list(ids)}
        if MODE == "numeric-ack":
            out["acks"] = [int(ids[0])] + ids[1:]
        elif MODE == "unknown-ack":
            out["acks"] = ids + ["no-such-id"]
        elif MODE == "double-ack":
            out["acks"] = ids + [ids[0]]
        elif MODE == "bad-anchor":
            out["emits"] = [[["x"], ["no-such-id"]]]
        send(out)


main()
