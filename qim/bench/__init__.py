"""`qim bench`: an open-loop load generator on the client SDK, its scenarios, a Kafka baseline.

Layout: :mod:`histogram` (exact percentiles), :mod:`procstats` (/proc CPU and RSS of the
stack's processes and of the bench itself), :mod:`target` (where the stack is, tokens, groups),
:mod:`schedule` and :mod:`accounting` (pure: the open-loop timetable and the send ledger),
:mod:`loadgen` (devices on the SDK), :mod:`scenarios` (send, fanout, login, connections),
:mod:`baseline` (the same hops on plain aiokafka), :mod:`report` (JSON + markdown), :mod:`cli`.
"""
