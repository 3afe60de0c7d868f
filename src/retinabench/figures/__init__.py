"""Figures (matplotlib, PNG + PDF); colours by pretraining domain, used consistently."""


# Layout facts the torch- and matplotlib-free planner needs (retinabench.plan.family_outputs plans one file per page).
LR_ENCODERS_PER_PAGE = 10   # lr transfer figure: 5 rows of 2 encoders x 2 sweep stages at double-column width


def lr_transfer_pages(n_encoders: int) -> int:
    """Files the learning-rate transfer figure needs for ``n_encoders`` swept encoders."""
    return max(1, -(-n_encoders // LR_ENCODERS_PER_PAGE))
