"""support_agent: a PydanticAI support agent whose tools are onceflow's.

``support_agent.agent`` is the agent (PydanticAI and ``onceflow_client`` only: an agent
runtime never installs the server), scripted offline or driven by a real model;
``support_agent.tools`` the read-only ``look_up_order`` tool it needs beside onceflow's
built-in ``refund_payment`` and ``send_email``, registered through the ``onceflow.tools``
entry point ``support_agent``; ``support_agent.shop`` the shop's orders table and its
checkout, which charges through onceflow; ``support_agent.demo`` the scripted scenario
``onceflow demo --agent`` shows.
"""
