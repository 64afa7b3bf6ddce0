"""Request routing: which board gets each choice (docs/gateway.md "Routing"). The router filters the
fleet's boards, its policy picks among the rest over the scorers' estimates (llm-d's filters and
scorers shape), and a `BoardClaim` holds the choice's place on the board it got; the gateway's own
pick-time view of what it left on each board (`sent_prefixes.py`) covers the window before a board
advertises it. Membership (which boards exist and what they report) is `gateway/fleet/`; which
model a board should serve is `gateway/placement/`."""
