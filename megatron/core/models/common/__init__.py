"""What every language model shares (language_module.LanguageModule)."""
from .language_module import LanguageModule
