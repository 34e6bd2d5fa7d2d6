"""Output formats, with no content of their own: the rich terminal (`terminal`), markdown tables
(`markdown`) and matplotlib figures (`plots`). Experiments and reports write through them."""
