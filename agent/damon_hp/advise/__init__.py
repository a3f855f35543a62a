"""`damon-hp advise`: what transparent huge pages would cost and gain for one process, read-only.

One module per job, pure where it can be:

    growth.py    the memory THP would add, from the page table (pagemap) and the mappings
    access.py    what the access source saw, per 2 MiB range, summed over the watch
    choices.py   THP-always, everywhere-collapse and damon-hp's rule (the policy run dry)
    hazards.py   settings of the process and the machine that spoil huge pages, with fixes
    verdict.py   the one line a person acts on, the text report and the JSON
    watch.py     the watch itself: the access source, snapshots, clean-up

Nothing here changes the process or the machine: no collapse, no madvise, no DAMOS scheme, no
THP setting. A kdamond of damon-hp's own (vaddr, paddr) only monitors and is removed after.
"""
