"""A raw stateful bolt speaking extension state (§9.7), broken in the way argv[1] says.

It keeps no state: every prepare is answered with empty changes, which is a
correct answer for a bolt whose tuples change nothing.

good             accepts state only when offered; acks every tuple, answers each prepare once
wrong-txid       answers prepare N with txid N + 1 (§9.7, state.order)
unasked          writes a prepared after each tuple, though no prepare is unanswered (state.order)
answers-commit   answers commit N with a prepared N as well (state.order)
twice            answers each prepare twice (state.order)
put-and-delete   answers with one key in both put and delete (state.invalid)
bad-delete       answers with delete as a string, not an array (state.invalid)
unoffered        accepts state even when nothing was offered (§9.2, handshake.extensions)
unnegotiated     never accepts state, but writes a prepared after each tuple (state.negotiated)
"""

import os
import sys

from _raw import frames, is_heartbeat, send

MODE = sys.argv[1] if len(sys.argv) > 1 else "good"


def prepared(txid, put=None, delete=None):
    return {"command": "state", "action": "prepared", "txid": txid, "put": put or {}, "delete": delete or []}


def main():
    messages = frames()
    try:
        hs = next(messages)
    except StopIteration:
        return
    pid = os.getpid()
    open(os.path.join(hs["pidDir"], str(pid)), "w").close()
    offered = hs.get("extensions") or []
    accept = ["state"] if "state" in offered and MODE != "unnegotiated" or MODE == "unoffered" else []
    send({"pid": pid, "extensions": accept} if accept else {"pid": pid})
    for msg in messages:
        if isinstance(msg, list):
            continue
        if is_heartbeat(msg):
            send({"command": "sync"})
        elif msg.get("command") == "state":
            action, txid = msg["action"], msg["txid"]
            if action == "prepare":
                if MODE == "wrong-txid":
                    send(prepared(txid + 1))
                elif MODE == "put-and-delete":
                    send(prepared(txid, {"k": 1}, ["k"]))
                elif MODE == "bad-delete":
                    send(prepared(txid, {}, "k"))
                else:
                    send(prepared(txid))
                    if MODE == "twice":
                        send(prepared(txid))
            elif action == "commit" and MODE == "answers-commit":
                send(prepared(txid))
        else:
            send({"command": "ack", "id": msg["id"]})
            if MODE in ("unasked", "unnegotiated"):
                send(prepared(1))


main()
