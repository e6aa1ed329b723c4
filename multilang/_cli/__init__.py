"""The ``multilang`` command line (click): ``main`` holds the commands; ``entry`` is the console
script, which installs the signal handlers before anything else loads."""
