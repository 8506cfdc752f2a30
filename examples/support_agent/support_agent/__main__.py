"""``python -m support_agent``: the support agent (see ``support_agent.agent``)."""

from support_agent.agent import main

main()
