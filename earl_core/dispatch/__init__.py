"""Data Dispatcher: transfer plans between parallel layouts, shipments of bulk fields, advantages from group scalars."""
