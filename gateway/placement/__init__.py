"""Model placement by demand (docs/models.md): which board should serve which model. `policy.py` is
the pure decision over a snapshot of the fleet and the waiting demand, `placer.py` the loop that
acts on it (switching a board through its operate plane), `waiters.py` the requests waiting for a
model no board serves yet. Membership is `gateway/fleet/`; routing a request is `gateway/routing/`."""
