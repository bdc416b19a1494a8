"""Machine-readable reports of a run: JSON (`json`, the versioned schema), SARIF (`sarif`) and
Markdown (`markdown`); the text report is rendered by `jaxmigrate.ui`."""
