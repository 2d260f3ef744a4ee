"""torch.distributed as a training step meets it, below the steps themselves: the process group
of a data-parallel step resolved into the settings the ``all_reduce`` pass reads, and the
collectives scheduled in its graph (``data_parallel``); models sharded with FSDP2 read as a
sharded step needs them (``fsdp``). The collective nodes are built in aten ops by the dialect
(:mod:`graphamp.fx.dialect.collectives`).
"""
