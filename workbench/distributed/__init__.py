"""distributed"""
