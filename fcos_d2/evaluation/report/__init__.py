"""After each evaluation, pictures of where the model fails: precision-recall curves, AP per
class and the worst images beside their ground truth, on one page (report.html).

``fcos_d2.evaluation.report.evaluator.ReportingCOCOEvaluator`` writes them; this package's import
stays light (config.py imports it for ``add_report_config``).
"""
from .config import ReportOptions, add_report_config

__all__ = ["ReportOptions", "add_report_config"]
