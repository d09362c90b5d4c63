"""The nodes of the default turn graph (conf/pipeline/agent_turn.yaml), one module per job."""
