"""The built-in tasks: environments of one turn (:class:`rllab.SingleTurn`), each scored by its rubric.

``arithmetic`` (addition, chain, countdown), ``strings`` (sort, reverse), ``files`` (``jsonl``),
``dataset`` + ``datafiles`` (local data sets, TRL and verl formats), ``reasoning`` (``reasoning_gym``).
"""
