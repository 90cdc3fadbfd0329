"""Recipes (docs/recipes.md): ``experiments/*.yaml`` read, checked and resolved.

* ``load``    load, override (``--set``, ``--params``) and resolve a recipe; read a run's copy back
* ``schema``  the keys a recipe may have, their types and defaults, located errors
* ``init``    ``repro500 init``: the starter files a new experiment gets
"""
