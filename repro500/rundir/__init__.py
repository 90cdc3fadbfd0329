"""The run directory (docs/contracts.md, "Run directory"): its files and how they are sealed.

* ``names``     the one owner of every file name in a run directory and a publication, and of
                the run's schemas (``sums`` and ``layout`` read them; others read ``layout.<NAME>``)
* ``layout``    where each file lives, and the readers every module shares (``read_json``,
                ``metric_records``)
* ``sums``      ``SHA256SUMS``: write, read and check the digest list
* ``archive``   ``repro500 pack`` / ``unpack``: one file, unpacked safely anywhere
* ``atomic``    writes that a crash never leaves half-done
* ``dvcmetrics`` a verdict's numbers as the flat DVC metrics file (``metrics/verdict.json``)
* ``writable``  a file-system failure as one sentence naming the place
"""
