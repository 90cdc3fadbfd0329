"""Publishing a run for others (``repro500 publish``) and reproducing one (``repro500 reproduce``).

* publication.py: write a publication directory and read one back with every check;
* datafiles.py: the data a run read and how to regenerate it byte for byte;
* source.py: where a publication comes from (directory, packed run, git without hooks or filters);
* reproduce.py: data, rerun, verdict against the publication;

Submodules are imported where used, so ``import repro500.publish`` costs nothing.
"""
