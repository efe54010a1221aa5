"""The pure decision core: policies over plain immutable views, no I/O, no clocks, no globals."""
