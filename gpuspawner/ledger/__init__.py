"""The ledger: allocation history, agents' tokens and the line's rows in a database (SQLAlchemy, migrations)."""
