"""The backtest: a site's own history through the real core, beside what people did."""
