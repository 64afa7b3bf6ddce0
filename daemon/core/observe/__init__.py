"""What the engine shows of itself, read-only: its events for telemetry and its state as views
(docs/daemon.md, "Who owns what").

This room owns:

- `observer.py`: the `EngineObserver` interface and the `ObserverHub` that delivers the engine's events;
- `observer_records.py`: the events built from the engine's sequences and device jobs;
- `snapshot.py` and `snapshot_parts.py`: the `EngineSnapshot`, taken in one step under the engine lock;
- `prefix_views.py`: a generation's prefix reuse and pending prefill work, for the snapshot;
- `status.py` and `views.py`: the Health, Status, WatchLoad and GetModel views built from a snapshot.

Nothing here changes the engine's state.
"""
