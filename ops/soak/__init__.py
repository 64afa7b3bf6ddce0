"""`calctl soak`: hours of open-loop traffic through the gateway of a local calsim fleet under a
repeating cycle of device faults, restarts and rollouts, every answer checked against a clean
reference fleet (docs/reliability.md).

Data flow: `mix` builds a seeded pool of OpenAI requests -> `references` asks the clean reference
fleet for each one once -> `capacity` fixes the arrival rate -> `traffic` sends the pool at that
rate while `chaos` plays the `fault_plan` and `supervisor` restarts and resumes boards as systemd
and an operator would, and `sampler` follows each process -> `classify` judges every request
against its reference -> `windows`, `drift`, `growth` summarise -> `verdict` -> `report` (soak.json)
and `plot` (soak.png). `run` ties them together; `calculet.ops.commands.soak` is the command line.
"""
