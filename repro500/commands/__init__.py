"""The CLI's commands, one module per command (or per family: ``data``, ``export``), each a thin
click layer that parses and calls the library; ``cli.py`` maps names to them and imports a
command's module only when it runs.  Options several commands share are ``options.py``'s.
"""
