"""verl 0.9.1's ``core_algos`` without its distributed runtime: :mod:`rllab_referee.verl_reference`
(shared with ``rllab crosscheck verl``), re-exported for the reference tests."""

from rllab_referee.verl_reference import (  # noqa: F401
    EXPECTED_VERSION,
    INSTALL_HINT,
    VerlReference,
    VerlUnavailable,
    _StandIn,
    _StandInFinder,
    load_verl,
)
