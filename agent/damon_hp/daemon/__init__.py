"""damon-hpd: one service that manages every process its rules select, under one budget.

    config.py     the TOML rules and the budget, checked with the line of every mistake
    selection.py  /proc scanned against the rules (include and exclude)
    budget.py     pure: ranges of all processes admitted by expected benefit under the budget
    vaddr.py      source vaddr: one kdamond of ours, one vaddr target per managed process,
                  its targets committed online as processes come and go
    service.py    the loop: one event stream (that vaddr kdamond's, or a physical one
                  reverse-mapped onto each process), rescans, status records, reload, stop
    rounds.py     one decision round: every process looked at, one reverse map, each one's
                  pipeline decides, the budget admits, each acts
    managed.py    one managed process: its pidfd, pipeline, what it holds and did
"""
