"""Resets and escalations of one board (docs/daemon.md, "The reset controller" and "Escalations").

This room owns:

- `controller.py`: the `ResetController`, the reset lifecycle and the halt, under the engine lock;
- `budget.py`: its bookkeeping (the reset and halt tables, the automatic reset budget, the gate, the tally);
- `host.py`: what the controller may ask of the engine;
- `operator.py` and `automatic.py`: an operator's reset and an escalation's reset, step by step;
- `escalation_watch.py`, `escalations.py`, `escalation_actions.py`: which faults escalate, the thread
  that acts on them, and what each escalation does;
- `submit_streak.py`: the streak of failed submits that drains the board.

Resets and escalations are recorded in the board's audit trail (`core/audit.py`), which `DeviceCore`
owns and lends to the controller and the escalation actions.
"""
