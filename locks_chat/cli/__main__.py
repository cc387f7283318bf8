"""``python -m locks_chat.cli``: the ``locks-chat`` command line."""

from locks_chat.cli import main

main()
