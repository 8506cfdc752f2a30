"""Development and test infrastructure: the embedded stack and far-side stand-ins.

Never imported by product code (workflows, activities, payments, the boundary).
"""
