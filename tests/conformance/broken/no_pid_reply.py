"""Known-broken bolt for the diagnosis tests: reads the handshake (and
creates the pid file) but never writes its pid reply; it then reads stdin
until EOF without ever writing anything. Raw stdio, stdlib only."""

import os

while os.read(0, 65536):
    pass
