"""One component process: spawning, the handshake, reading and writing frames, reaping
(``process``), and the restart policy (``supervisor``)."""
